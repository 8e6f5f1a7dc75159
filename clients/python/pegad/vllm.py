"""pegad.vllm: a vLLM v1 KV connector (KVConnectorBase_V1) on the node's pegad.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "PegadConnector",
        "kv_connector_module_path": "pegad.vllm", "kv_role": "kv_both",
        "kv_connector_extra_config": {"socket": "/run/pegad/pegad.sock"}}'

Written against vllm-project/vllm vllm/distributed/kv_transfer/kv_connector/
v1/base.py at commit 003df2961dd8830c317a61f9745ccd557da9fa06 (the test stub
of that file pins the signatures). docs/engines.md is the user's page.

What it does:
- Scheduler: get_num_new_matched_tokens asks the daemon (LOOKUP, no pin, no
  LRU touch) how many of the request's chained block hashes every TP/PP rank
  holds (the minimum over the ranks' namespaces, pegad.keys), so it is free
  of side effects and never reports a prefix some rank cannot load. With
  "cluster": true, a longer prefix the cluster index says another node
  holds (LOOKUP_CLUSTER) is prefetched into this node first; meanwhile it
  answers None (ask again later). Loads are synchronous
  within the step (second value False).
- update_state_after_alloc pins the blocks to load for every rank
  (LOOKUP_PIN, when the daemon has it; "pin": false turns it off) and hands
  the lease tokens to the workers, which adopt them: from then until the
  load, nothing evicts those blocks.
- Worker loads layer by layer: start_load_kv adopts the scheduler's pin,
  or, without one, leases every block to load (one round trip); wait_for_layer_load(layer) copies that layer of every
  block from the pool into the paged KV cache just before the layer's
  attention, and the pins end after the last layer. A block missing at
  start_load_kv (evicted since the lookup) or whose lease ended during the
  copy (or not pinned by the scheduler) is reported by
  get_block_ids_with_load_errors, with every later block
  of its request, and vLLM recomputes them; nothing is loaded from it.
- Worker saves asynchronously: start_load_kv reserves room in the pool for
  the blocks that become full in this step; save_kv_layer (called after the
  layer's attention wrote its K/V, so the layer's data is final) queues the
  copy of that layer into the reserved room on a save thread; wait_for_save
  waits for the copies (vLLM may overwrite the blocks after it returns) and
  leaves the commit to the save thread.
- request_finished stores nothing beyond what the steps saved and returns
  (False, None): blocks can be freed at once. Only the first
  request.num_publishable_block_hashes blocks are ever saved.
- When pegad is stopped or fails, every call turns into "nothing cached":
  lookups answer 0, loads report their blocks as errors (recomputed), saves
  are dropped; the client is dialled again at most every "retry" seconds.

A block of rank r is stored under pegad.keys.rank_namespace(base, tp, pp)
as one segment laid out [layer][K, V][block_size * heads * head_dim] in the
cache dtype: the bytes of kv_caches[layer][0|1, block_id].

The worker copies with numpy: register_kv_caches takes numpy arrays or CPU
torch tensors (their .numpy() views). CUDA tensors are not handled here.
"""

import concurrent.futures
import logging
import os
import threading
from dataclasses import dataclass, field

import numpy as np

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                               KVConnectorRole)

from . import _engine, errors, keys
from .client import DEFAULT_SOCKET

__all__ = ["PegadConnector", "PegadConnectorMetadata", "UPSTREAM_COMMIT"]

UPSTREAM_COMMIT = "003df2961dd8830c317a61f9745ccd557da9fa06"
# A layer's load of at least this many bytes is copied by two threads.
SPLIT_BYTES = 4 << 20
KV_LAYOUT = "NHD"  # kv_caches[layer] is [2, num_blocks, block_size, heads, head_dim]

log = logging.getLogger("pegad.vllm")


@dataclass
class BlockRun:
    """Blocks of one request to load or save in this step, in chain order."""
    req_id: str
    block_ids: list
    hashes: list  # bytes, as pegad keys them
    pins: dict = None  # loads: rank namespace -> lease token of the scheduler's pin (LOOKUP_PIN)


@dataclass
class PegadConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> workers, once per step (picklable)."""
    loads: list = field(default_factory=list)  # BlockRun
    saves: list = field(default_factory=list)  # BlockRun


@dataclass
class _ReqState:
    """Scheduler-side: what is known of one running request."""
    request: object
    block_ids: list
    saved: int  # blocks [0, saved) are stored (or were found stored)
    load: BlockRun = None  # emitted by the next build_connector_meta
    pins: list = field(default_factory=list)  # the scheduler's Pin objects, kept until the request ends


def _ranks(vllm_config):
    """(tp_rank, pp_rank) of this worker process."""
    pc = vllm_config.parallel_config
    try:
        from vllm.distributed.parallel_state import (get_pipeline_model_parallel_rank,
                                                     get_tensor_model_parallel_rank)
        return get_tensor_model_parallel_rank(), get_pipeline_model_parallel_rank()
    except (ImportError, AssertionError, AttributeError):
        rank = getattr(pc, "rank", 0)
        return rank % pc.tensor_parallel_size, rank // pc.tensor_parallel_size


def _call(cfg, name, default):
    f = getattr(cfg, name, None)
    try:
        return f() if callable(f) else default
    except Exception:  # a config that cannot answer: the factor is left out, not guessed
        return default


def base_namespace(vllm_config):
    """The model's base namespace (pegad.keys.model_namespace of the
    model, dtype, cache dtype, layout, block size, TP/PP sizes and shape),
    or kv_connector_extra_config["namespace"] when set."""
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
    if extra.get("namespace"):
        return str(extra["namespace"])
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    return keys.model_namespace(
        mc.model, mc.dtype, KV_LAYOUT, pc.tensor_parallel_size, pc.pipeline_parallel_size, cc.cache_dtype,
        cc.block_size, engine="vllm", num_layers=_call(mc, "get_total_num_hidden_layers", None),
        num_kv_heads=_call(mc, "get_total_num_kv_heads", None), head_size=_call(mc, "get_head_size", None))


class PegadConnector(KVConnectorBase_V1):
    """vLLM's KV connector on pegad; see the module doc."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
        pc = vllm_config.parallel_config
        self.block_size = vllm_config.cache_config.block_size
        self.base = base_namespace(vllm_config)
        self.namespaces = keys.rank_namespaces(self.base, pc.tensor_parallel_size, pc.pipeline_parallel_size)
        self.cluster = bool(extra.get("cluster", False))
        self.pin = bool(extra.get("pin", True))  # scheduler pins, workers adopt (when the daemon can)
        self.prefetch_timeout = float(extra.get("prefetch_timeout", 5.0))  # the longest a request waits on it
        # Seconds a miss waits for the cluster index to list another node's
        # prefix (the index lags puts by some 20-50 ms, docs/cluster.md);
        # off the scheduler thread, the request answering None meanwhile.
        self.cluster_wait = float(extra.get("cluster_wait", 0.0))
        self.link = _engine.Link(extra.get("socket") or os.environ.get("PEGAD_SOCKET") or DEFAULT_SOCKET,
                                 timeout=float(extra.get("timeout", 5.0)), retry=float(extra.get("retry", 1.0)))
        self.stats = {"lookups": 0, "hit_blocks": 0, "loaded_blocks": 0, "load_error_blocks": 0,
                      "saved_blocks": 0, "save_dropped_blocks": 0, "loaded_bytes": 0, "saved_bytes": 0}
        self._stats_mu = threading.Lock()  # guards stats (the save thread adds to it)
        if role == KVConnectorRole.SCHEDULER:
            self._reqs = {}  # req_id -> _ReqState
            self._matched = {}  # req_id -> (first block, blocks held): memo of the last answer, nothing else
            self._prefetch = {}  # req_id -> Future of a cluster prefetch (done: not tried again)
            self._prefetcher = None
        else:
            tp_rank, pp_rank = _ranks(vllm_config)
            self.namespace = keys.rank_namespace(self.base, tp_rank, pp_rank)
            self._layers = {}  # layer name -> index, in registration order
            self._caches = []  # per layer: uint8 view [2, num_blocks, bytes of one K (or V) block]
            self._saver = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pegad-save")
            self._loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pegad-load")
            self._split = int(extra.get("load_split_bytes", SPLIT_BYTES))
            self._reset_step()
            self._errors = set()

    def _count(self, **kw):
        with self._stats_mu:
            for k, v in kw.items():
                self.stats[k] += v

    # ---------------------------------------------------------------- scheduler

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """Tokens beyond num_computed_tokens that every rank can load: whole
        blocks, never the prompt's last token (vLLM must compute it). None
        while a cluster prefetch for the request runs. No pin, no state
        beyond a memo of the answer."""
        bs = self.block_size
        start = num_computed_tokens // bs
        limit = min(len(request.block_hashes), (request.num_tokens - 1) // bs)
        if limit <= start:
            return 0, False
        rid = request.request_id
        fut = self._prefetch.get(rid)
        if fut is not None and not fut.done():
            return None, False
        hashes = [keys.hash_bytes(h) for h in request.block_hashes[start:limit]]
        client = self.link.get()
        n = 0
        if client is not None:
            try:
                n = _engine.prefix(client, self.namespaces, hashes)
            except _engine.FAILURES as e:
                self.link.failed(client, e)
                n = 0
        self._count(lookups=1, hit_blocks=n)
        if self.cluster and client is not None and n < len(hashes) and fut is None:
            if self._elsewhere(client, hashes, n):
                self._prefetch[rid] = self._start_prefetch(client, hashes[n:])
                return None, False
            if self.cluster_wait > 0:  # the index may not list it yet: wait for it off this thread
                self._prefetch[rid] = self._start_prefetch(client, hashes[n:], chain=(hashes, n))
                return None, False
        self._matched[rid] = (start, n)
        return max(0, (start + n) * bs - num_computed_tokens), False

    def _elsewhere(self, client, hashes, n):
        """Whether the cluster index names a node holding more than the n
        blocks here (LOOKUP_CLUSTER; a daemon without it: assume so)."""
        if not hasattr(client, "lookup_cluster"):
            return True
        try:
            hit = client.lookup_cluster(self.namespaces[0], hashes)
        except _engine.FAILURES as e:
            log.info("cluster lookup: %s", e)
            return False
        return hit.peer is not None and hit.n > n

    def _start_prefetch(self, client, hashes, chain=None):
        """Fetch hashes from whichever nodes the cluster index names, for every
        rank's namespace, off the scheduler thread. chain (the request's
        hashes, the n here): first wait up to cluster_wait for the index to
        list a node holding more than n, and fetch only then."""
        if self._prefetcher is None:
            self._prefetcher = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pegad-prefetch")

        def run():
            if chain is not None:
                try:
                    hit = client.lookup_cluster(self.namespaces[0], chain[0], wait=self.cluster_wait)
                except _engine.FAILURES as e:
                    log.info("cluster lookup: %s", e)
                    return
                if hit.peer is None or hit.n <= chain[1]:
                    return
            for ns in self.namespaces:
                try:
                    client.prefetch(ns, hashes, timeout=self.prefetch_timeout)
                except _engine.FAILURES as e:  # partly fetched or no index: the lookup after it says what is here
                    log.info("cluster prefetch of %d blocks under %s: %s", len(hashes), ns, e)
        return self._prefetcher.submit(run)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        """Record the blocks to load (on the first call with external
        tokens); a second call for the request only updates its blocks."""
        rid = request.request_id
        block_ids = list(blocks.get_block_ids()[0])
        st = self._reqs.get(rid)
        if st is None:
            st = self._reqs[rid] = _ReqState(request, block_ids, 0)
        elif block_ids:
            st.block_ids = block_ids
        if num_external_tokens <= 0:
            return
        start, n = self._matched.pop(rid, (0, 0))
        n = min(n, (num_external_tokens + self.block_size - 1) // self.block_size)
        if n > 0 and len(block_ids) >= start + n:
            hashes = [keys.hash_bytes(h) for h in request.block_hashes[start:start + n]]
            st.load = BlockRun(rid, block_ids[start:start + n], hashes, self._pin_ranks(st, hashes))
            st.saved = max(st.saved, start + n)

    def _pin_ranks(self, st, hashes):
        """Pin the blocks to load for every rank (LOOKUP_PIN), so nothing
        evicts them before the workers adopt the pins: rank namespace ->
        token, or None against a daemon without pins (the workers lease
        then, and report what went missing meanwhile)."""
        client = self.link.get()
        if not self.pin or client is None or not hasattr(client, "lookup_pin"):
            return None
        tokens = {}
        try:
            for ns in self.namespaces:
                pin = client.lookup_pin(ns, hashes)
                st.pins.append(pin)
                tokens[ns] = pin.token
        except _engine.FAILURES as e:
            self.link.failed(client, e)
            return None
        return tokens

    def build_connector_meta(self, scheduler_output):
        """This step's loads (recorded by update_state_after_alloc) and
        saves: the blocks of each scheduled request that are full once the
        step ran, publishable, and not stored yet."""
        meta = PegadConnectorMetadata()
        computed = {}
        for nr in scheduler_output.scheduled_new_reqs:
            st = self._reqs.get(nr.req_id)
            if st is None:
                continue
            st.block_ids = list(nr.block_ids[0])
            computed[nr.req_id] = nr.num_computed_tokens
        cached = scheduler_output.scheduled_cached_reqs
        resumed = set(getattr(cached, "resumed_req_ids", ()) or ())  # their new_block_ids are all their blocks
        flags = getattr(cached, "resumed_from_preemption", None)  # the older form of the same
        for i, rid in enumerate(cached.req_ids):
            st = self._reqs.get(rid)
            if st is None:
                continue
            new = cached.new_block_ids[i]
            if rid in resumed or (flags is not None and flags[i]):
                st.block_ids = list(new[0]) if new is not None else []
            elif new is not None:
                st.block_ids.extend(new[0])
            computed[rid] = cached.num_computed_tokens[i]
        for rid, ncomp in computed.items():
            st = self._reqs[rid]
            if st.load is not None:
                meta.loads.append(st.load)
                st.load = None
            # A request rolled back (a failed load) recomputes and saves again.
            st.saved = min(st.saved, ncomp // self.block_size)
            req = st.request
            full = (ncomp + scheduler_output.num_scheduled_tokens.get(rid, 0)) // self.block_size
            publishable = getattr(req, "num_publishable_block_hashes", None)
            full = min(full, len(req.block_hashes), len(st.block_ids),
                       publishable if publishable is not None else full)
            if full > st.saved:
                meta.saves.append(BlockRun(rid, st.block_ids[st.saved:full],
                                           [keys.hash_bytes(h) for h in req.block_hashes[st.saved:full]]))
                st.saved = full
        return meta

    def request_finished(self, request, block_ids):
        """Forget the request. Every publishable full block was saved by the
        step that filled it, so the blocks can be freed now: (False, None)."""
        rid = request.request_id
        st = self._reqs.pop(rid, None)
        if st is not None and st.load is not None:  # pinned for a load never handed to the workers
            for pin in st.pins:
                try:
                    pin.release()
                except _engine.FAILURES:
                    pass  # it ends at its lease timeout anyway
        self._matched.pop(rid, None)
        self._prefetch.pop(rid, None)
        return False, None

    # ---------------------------------------------------------------- worker

    def register_kv_caches(self, kv_caches):
        """kv_caches: layer name -> [2, num_blocks, block_size, heads,
        head_dim] (numpy array or CPU torch tensor), in model order."""
        self._layers, self._caches = {}, []
        for i, (name, t) in enumerate(kv_caches.items()):
            a = _engine.as_numpy(t)
            if a.ndim != 5 or a.shape[0] != 2 or a.shape[2] != self.block_size or not a.flags.c_contiguous:
                raise ValueError(f"layer {name}: want a C-contiguous [2, num_blocks, {self.block_size}, heads, "
                                 f"head_dim] cache, got shape {a.shape}")
            self._layers[name] = i
            self._caches.append(a.view(np.uint8).reshape(2, a.shape[1], -1))
        self._half = self._caches[0].shape[2] if self._caches else 0  # bytes of one block's K of one layer
        self.block_bytes = 2 * self._half * len(self._caches)

    def _reset_step(self):
        self._load = []  # runs (block ids, uint8 view [n, layers, 2, half] of the pool) to copy
        self._load_readers = []  # (req BlockRun, index in run, Reader)
        self._loaded_layers = 0
        self._load_client = None  # the client the step's leases were taken through
        self._save = []  # runs (block ids, uint8 view [n, layers, 2, half] of reserved room)
        self._writers = []  # (req_id, Writer), reserved through _save_client
        self._save_client = None
        self._save_futs = []
        self._failed_reqs = set()  # requests whose load failed this step: their saves follow wrong KV

    def start_load_kv(self, forward_context, **kwargs):
        """Pin the step's blocks to load and reserve room for its saves;
        the copies happen per layer (wait_for_layer_load, save_kv_layer)."""
        meta = self._connector_metadata
        if meta is None or (not meta.loads and not meta.saves):
            return
        client = self._load_client = self.link.get()
        for run in meta.loads:
            self._pin(client, run)
        if meta.saves:
            self._reserve(client, meta.saves)

    def _pin(self, client, run):
        res = None
        if client is not None:
            try:
                res = self._adopt(client, run)
                if res is None:
                    res = client.lease_batch(self.namespace, run.hashes)
            except _engine.FAILURES as e:
                self.link.failed(client, e)
        if res is None:
            self._load_failed(run, 0)
            return
        bad = next((i for i, r in enumerate(res) if not _usable(r, self.block_bytes)), len(res))
        good = [r for r in res[:bad]]
        extra = [r for r in res[bad:] if not isinstance(r, Exception)]
        if extra:  # after a missing block nothing of the chain is loaded
            _release(client, extra)
        if good:
            self._load.extend(self._runs(good[0].pool, run.block_ids[:bad], [r.buffer for r in good]))
        self._load_readers.extend((run, i, r) for i, r in enumerate(good))
        if bad < len(res):
            self._load_failed(run, bad)
        self._count(loaded_blocks=bad, loaded_bytes=bad * self.block_bytes)

    def _adopt(self, client, run):
        """The readers of the scheduler's pin for this rank, in chain order,
        padded with NotFound for blocks it did not pin; None when there is
        no pin to adopt (or it cannot be adopted: lapsed, taken), so the
        blocks are leased instead."""
        token = (run.pins or {}).get(self.namespace)
        if token is None or not hasattr(client, "adopt"):
            return None
        try:
            readers = client.adopt(token)
        except (errors.NotFound, errors.Denied, errors.InvalidArgument, errors.LeaseEnded,
                errors.FailedPrecondition) as e:
            log.info("pin of %d blocks not adopted (%s): leasing them", len(run.hashes), e)
            return None
        missing = [errors.NotFound("not pinned by the scheduler")] * (len(run.hashes) - len(readers))
        return list(readers[:len(run.hashes)]) + missing

    def _runs(self, pool, block_ids, bufs):
        """Group blocks whose pool buffers lie back to back (a batch's
        blocks mostly do) into runs copied by one numpy call per layer
        instead of one per block: [(block ids, view [n, layers, 2, half])].
        pool: the mapping the buffers lie in (their lease's: after a daemon
        restart the client maps a new pool, leases of one call share one)."""
        pool = np.frombuffer(pool, np.uint8)
        base = pool.ctypes.data
        size = self.block_bytes
        out = []
        start = prev = None
        ids = []
        for bid, buf in zip(block_ids, bufs):
            addr = np.frombuffer(buf, np.uint8).ctypes.data - base
            if prev is not None and addr != prev + size:
                out.append((np.array(ids), pool[start:prev + size].reshape(len(ids), len(self._caches), 2, -1)))
                start, ids = None, []
            if start is None:
                start = addr
            ids.append(bid)
            prev = addr
        if ids:
            out.append((np.array(ids), pool[start:prev + size].reshape(len(ids), len(self._caches), 2, -1)))
        return out

    def _load_failed(self, run, i):
        self._failed_reqs.add(run.req_id)
        self._errors.update(run.block_ids[i:])
        self._count(load_error_blocks=len(run.block_ids) - i)

    def _reserve(self, client, runs):
        self._save_client = client
        if client is None:
            self._count(save_dropped_blocks=sum(len(r.block_ids) for r in runs))
            return
        reqs = [(self.namespace, h, self.block_bytes) for run in runs for h in run.hashes]
        bids = [(run.req_id, b) for run in runs for b in run.block_ids]
        try:
            res = client.alloc_batch(reqs)
        except _engine.FAILURES as e:
            self.link.failed(client, e)
            self._count(save_dropped_blocks=len(reqs))
            return
        ids = []
        for (rid, bid), w in zip(bids, res):
            if isinstance(w, errors.Exists):
                continue  # stored already (by us or another engine): nothing to write
            if isinstance(w, Exception):
                self._count(save_dropped_blocks=1)
                continue
            self._writers.append((rid, w))
            ids.append(bid)
        if self._writers:
            self._save = self._runs(self._writers[0][1].pool, ids, [w.buffer for _, w in self._writers])

    def wait_for_layer_load(self, layer_name):
        """Copy every pinned block's part of this layer (and of any earlier
        layer not copied yet) into the paged cache. A large load is split
        in two halves copied at once, here and on the load thread (numpy
        lets go of the GIL while it copies)."""
        if not self._load or layer_name not in self._layers:
            return  # a layer without a registered cache of its own has nothing to load
        upto = self._layers[layer_name] + 1
        split = None
        if sum(len(b) for b, _ in self._load) * 2 * self._half >= self._split:
            split = _halves(self._load)
        for layer in range(self._loaded_layers, upto):
            cache = self._caches[layer]
            if split is None:
                _scatter(cache, layer, self._load)
                continue
            other = self._loader.submit(_scatter, cache, layer, split[1])
            try:
                _scatter(cache, layer, split[0])
            finally:
                other.result()
        self._loaded_layers = max(self._loaded_layers, upto)
        if self._loaded_layers == len(self._caches):
            self._end_load()

    def _end_load(self):
        """Unpin the loaded blocks (one round trip). A lease that ended
        during the copy may have let its memory be reused; the release
        does not say which one, so every block of the step's loads is
        reported as failed and recomputed (rare: a lease outlived its
        timeout)."""
        readers, self._load_readers, self._load = self._load_readers, [], []
        if not readers:
            return
        client = self._load_client
        try:
            client.release_batch([r for _, _, r in readers])
        except _engine.FAILURES as e:
            # An ended lease, or a connection that broke (a daemon
            # restart): nothing proves the bytes were not reused meanwhile.
            for run, i, _ in readers:
                if i == 0:
                    self._load_failed(run, 0)
            if not isinstance(e, errors.LeaseEnded):
                self.link.failed(client, e)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        """Queue the copy of this layer of the step's full blocks into the
        room reserved for them (the layer's K/V are final now)."""
        if not self._save or layer_name not in self._layers:
            return
        layer = self._layers[layer_name]
        self._save_futs.append(self._saver.submit(self._copy_layer, layer, self._save))

    def _copy_layer(self, layer, save):
        cache = self._caches[layer]
        for bids, dst in save:
            dst[:, layer] = cache[:, bids].swapaxes(0, 1)

    def wait_for_save(self):
        """Wait for the copies out of the paged cache; commit on the save
        thread (the engine's buffers are no longer read)."""
        if self._load:  # an engine that skipped wait_for_layer_load for some layer
            self.wait_for_layer_load(next(reversed(self._layers)))
        if self._save:
            for f in self._save_futs:
                f.result()
            # A request whose load failed computed this step on a wrong
            # prefix, and a layer not saved leaves bytes that are not the
            # block's: those are given back, never stored.
            whole = len(self._save_futs) == len(self._caches)
            good = [w for rid, w in self._writers if whole and rid not in self._failed_reqs]
            bad = [w for rid, w in self._writers if not whole or rid in self._failed_reqs]
            client = self._save_client
            if good:
                self._saver.submit(self._commit, client, good)
            if bad:
                self._saver.submit(self._abort, client, bad)
        self._reset_step()

    def _commit(self, client, writers):
        try:
            client.commit_batch(writers)
            self._count(saved_blocks=len(writers), saved_bytes=len(writers) * self.block_bytes)
        except _engine.FAILURES as e:
            self._count(save_dropped_blocks=len(writers))
            if not isinstance(e, (errors.Exists, errors.LeaseEnded)):
                self.link.failed(client, e)

    def _abort(self, client, writers):
        self._count(save_dropped_blocks=len(writers))
        try:
            client.abort_batch(writers)
        except _engine.FAILURES as e:
            self.link.failed(client, e)

    def get_finished(self, finished_req_ids):
        """Loads are synchronous and saves never hold vLLM's blocks."""
        return None, None

    def get_block_ids_with_load_errors(self):
        """Block ids whose load failed since the last call (recompute them)."""
        out, self._errors = self._errors, set()
        return out

    def flush(self, timeout=None):
        """Wait until the queued saves are committed (tests, shutdown)."""
        if self.role == KVConnectorRole.WORKER:
            self._saver.submit(lambda: None).result(timeout)

    def shutdown(self):
        if self.role == KVConnectorRole.WORKER:
            self._saver.shutdown(wait=True)
            self._loader.shutdown(wait=True)
        elif self._prefetcher is not None:
            self._prefetcher.shutdown(wait=False)
        self.link.close()


def _scatter(cache, layer, runs):
    """This layer of each run's blocks into the paged cache."""
    for bids, src in runs:
        cache[:, bids] = src[:, layer].swapaxes(0, 1)


def _halves(runs):
    """runs split into two lists of (about) the same number of blocks."""
    mid = sum(len(b) for b, _ in runs) // 2
    first, second, seen = [], [], 0
    for bids, v in runs:
        n = len(bids)
        if seen + n <= mid:
            first.append((bids, v))
        elif seen >= mid:
            second.append((bids, v))
        else:
            k = mid - seen
            first.append((bids[:k], v[:k]))
            second.append((bids[k:], v[k:]))
        seen += n
    return first, second


def _usable(r, size):
    return not isinstance(r, Exception) and r.buffer is not None and r.size == size


def _release(client, readers):
    try:
        client.release_batch(readers)
    except _engine.FAILURES:
        pass  # the pins end with the connection anyway
