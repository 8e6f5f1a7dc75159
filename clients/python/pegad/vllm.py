"""pegad.vllm: a vLLM v1 KV connector (KVConnectorBase_V1) on the node's pegad.

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "PegadConnector",
        "kv_connector_module_path": "pegad.vllm", "kv_role": "kv_both",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"socket": "/run/pegad/pegad.sock"}}'

Written against vllm-project/vllm at commit
00f4240ee6458263d76cf51ca7901ce1350bb4d1 (its v1 KV connector base.py and
the model runner's connector mixin; the test stubs pin the signatures).
docs/engines.md is the user's page.

It owns the scheduler side (lookups, pins, what each step loads and saves)
and hands the worker side to pegad._vllm_worker. It must never raise a
daemon failure into vLLM and never rely on vLLM's layer hooks
(wait_for_layer_load, save_kv_layer), which full CUDA graph replay skips.

What it does:
- Scheduler: get_num_new_matched_tokens asks the daemon how many of the
  request's chained block hashes every rank holds (the minimum over the
  ranks' namespaces, pegad.keys), and answers them as an asynchronous load
  (second value True; "load_async": false makes loads synchronous). Under
  vLLM's "recompute" policy the lookup is free of side effects (LOOKUP);
  under "fail" (vLLM's default) a failed load ends the request, so the
  answer is a promise: the prefix is pinned as it is counted (LOOKUP_PIN).
  With "cluster": true, a longer prefix another node holds is prefetched
  first; meanwhile it answers None (ask again later).
- update_state_after_alloc pins the blocks to load for every rank (or
  keeps the lookup's pin) and hands the lease tokens to the workers, which
  adopt them.
- Worker loads: start_load_kv (before or after the forward, as the runner
  chooses) hands each load to the load thread, which adopts or leases the
  blocks, copies them into the paged cache (pegad._device: one copy per
  layer and run of blocks) and releases them; get_finished reports the
  request, get_block_ids_with_load_errors its blocks that failed (a
  missing block and every later one of the chain).
- Worker saves: wait_for_save (called once per step after the forward,
  with the metadata still bound) reserves room for the step's full blocks,
  copies them out of the paged cache and commits on the save thread.
  Only the first request.num_publishable_block_hashes blocks are saved.
- request_finished (and request_finished_all_groups, SupportsHMA) returns
  (False, None): nothing holds vLLM's blocks. More than one KV cache group
  (a hybrid model under the hybrid allocator) is refused at start-up.
- P/D (kv_role kv_producer / kv_consumer / kv_both; pegad._vllm_pd owns
  the parameters): a producer's request with do_remote_decode has its
  last step's saves committed before the step ends, and request_finished
  hands its prompt's blocks off on this node's pegad (Client.handoff) and
  returns (False, the parameters a decode needs, vLLM's remote_* keys). A
  consumer's request with do_remote_prefill is answered as an asynchronous
  load whose workers pull the blocks from the named pegad (prefetch with
  the handoff token, known_peer_only) in parts of pull_chunk_bytes, each
  part loaded while the next is read; a kv_consumer saves nothing.
- Stats through build_kv_connector_stats / get_kv_connector_stats /
  build_prom_metrics; BlockStored events of the blocks each step saves
  through take_events.
- When pegad is stopped or fails, every call turns into "nothing cached":
  lookups answer 0, loads report their blocks as errors, saves are
  dropped; the client is dialled again at most every "retry" seconds.

A block of rank r is stored under pegad.keys.rank_namespace(base, tp, pp)
in the one stored byte order of docs/local-protocol.md: per layer K then V,
each [block_size, heads, head_dim] (MLA: the latent [block_size, dim],
stored once under TP rank 0's namespace and loaded by every rank).
"""

import concurrent.futures
import logging
import os
import threading
from dataclasses import dataclass, field

from vllm.distributed.kv_transfer.kv_connector.v1 import base as _base
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                               KVConnectorRole)

from . import _engine, _vllm_pd, _vllm_stats, _vllm_worker, errors, keys
from .client import DEFAULT_SOCKET

__all__ = ["PegadConnector", "PegadConnectorMetadata", "UPSTREAM_COMMIT"]

UPSTREAM_COMMIT = "00f4240ee6458263d76cf51ca7901ce1350bb4d1"
# The stored byte order's name in the namespace: the token-major order of
# FlashAttention's NHD, which blocks stored before any other layout was
# served already have (so they stay readable).
KV_LAYOUT = "NHD"
# vLLM before SupportsHMA: the hybrid allocator cannot be turned on with a connector there.
_HMA = (_base.SupportsHMA,) if hasattr(_base, "SupportsHMA") else ()

log = logging.getLogger("pegad.vllm")


@dataclass
class BlockRun:
    """Blocks of one request to load or save in this step, in chain order."""
    req_id: str
    block_ids: list
    hashes: list  # bytes, as pegad keys them
    pins: dict = None  # loads: rank namespace -> lease token of the scheduler's pin (LOOKUP_PIN)
    remote: object = None  # loads: a _vllm_pd.RemotePull, pulled from the producer's pegad first
    handoff: bool = False  # saves: a P/D producer's, committed before the step ends (request_finished hands them off)


@dataclass
class PegadConnectorMetadata(KVConnectorMetadata):
    """Scheduler -> workers, once per step (picklable)."""
    loads: list = field(default_factory=list)  # BlockRun
    saves: list = field(default_factory=list)  # BlockRun
    sync: bool = False  # loads feed this step's forward (vLLM calls start_load_kv before it)


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


def _call(cfg, name, default, *args):
    f = getattr(cfg, name, None)
    try:
        return f(*args) if callable(f) else default
    except Exception:  # a config that cannot answer: the factor is left out, not guessed
        return default


def _is_mla(vllm_config):
    return bool(getattr(vllm_config.model_config, "use_mla", False))


def base_namespace(vllm_config):
    """The model's base namespace (pegad.keys.model_namespace of the
    model, dtype, cache dtype, stored order, block size, TP/PP sizes and
    shape), or kv_connector_extra_config["namespace"] when set. MLA stores
    one latent for all TP ranks, so its namespace leaves the TP size out."""
    extra = vllm_config.kv_transfer_config.kv_connector_extra_config or {}
    if extra.get("namespace"):
        return str(extra["namespace"])
    mc, cc, pc = vllm_config.model_config, vllm_config.cache_config, vllm_config.parallel_config
    mla = _is_mla(vllm_config)
    return keys.model_namespace(
        mc.model, mc.dtype, "MLA" if mla else KV_LAYOUT, 1 if mla else pc.tensor_parallel_size,
        pc.pipeline_parallel_size, cc.cache_dtype, cc.block_size, engine="vllm",
        num_layers=_call(mc, "get_total_num_hidden_layers", None),
        num_kv_heads=None if mla else _call(mc, "get_total_num_kv_heads", None),
        head_size=_call(mc, "get_head_size", None))


class PegadConnector(KVConnectorBase_V1, *_HMA):
    """vLLM's KV connector on pegad; see the module doc."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config, role, kv_cache_config)
        ktc = vllm_config.kv_transfer_config
        extra = ktc.kv_connector_extra_config or {}
        pc = vllm_config.parallel_config
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or ()
        if len(groups) > 1:
            raise ValueError(f"pegad.vllm stores one KV cache group, this model has {len(groups)} (a hybrid "
                             "model under the hybrid allocator): pass --disable-hybrid-kv-cache-manager")
        self.block_size = vllm_config.cache_config.block_size
        self.base = base_namespace(vllm_config)
        self.mla = _is_mla(vllm_config)
        # MLA: one latent for every TP rank, under TP rank 0's namespace.
        self.namespaces = keys.rank_namespaces(self.base, 1 if self.mla else pc.tensor_parallel_size,
                                               pc.pipeline_parallel_size)
        role_name = getattr(ktc, "kv_role", None) or "kv_both"
        if role_name not in ("kv_producer", "kv_consumer", "kv_both"):
            raise ValueError(f"kv_role {role_name!r}: pegad.vllm is kv_producer, kv_consumer or kv_both")
        # P/D (module pegad._vllm_pd): a producer saves and hands its prompts
        # off (do_remote_decode), a consumer pulls them (do_remote_prefill)
        # and saves nothing; kv_both does both, and both look up and load
        # this node's blocks as before.
        self.produces = role_name != "kv_consumer"
        self.consumes = role_name != "kv_producer"
        self.handoff_ttl = float(extra.get("handoff_ttl", 30.0))
        # request_finished blocks the scheduler this long at most, for a commit it does not see
        self.handoff_wait = float(extra.get("handoff_wait", 0.1))
        self.pull_timeout = float(extra.get("pull_timeout", 10.0))
        self.cluster = bool(extra.get("cluster", False))
        self.pin = bool(extra.get("pin", True))  # scheduler pins, workers adopt (when the daemon can)
        self.load_async = bool(extra.get("load_async", True))
        # vLLM's default "fail" ends a request whose load fails: then a
        # lookup is a promise, pinned as it is counted.
        self.fail_policy = getattr(ktc, "kv_load_failure_policy", "fail") != "recompute"
        self.prefetch_timeout = float(extra.get("prefetch_timeout", 5.0))  # the longest a request waits on it
        # Seconds a miss waits for the cluster index to list another node's
        # prefix (the index lags puts by some 20-50 ms, docs/cluster.md);
        # off the scheduler thread, the request answering None meanwhile.
        self.cluster_wait = float(extra.get("cluster_wait", 0.0))
        self.link = _engine.Link(extra.get("socket") or os.environ.get("PEGAD_SOCKET") or DEFAULT_SOCKET,
                                 timeout=float(extra.get("timeout", 5.0)), retry=float(extra.get("retry", 1.0)))
        self.stats = dict.fromkeys(_vllm_stats.COUNTERS, 0)
        self._reported = dict(self.stats)  # what get_kv_connector_stats handed vLLM so far
        self._stats_mu = threading.Lock()  # guards stats (the save and load threads add to it)
        if role == KVConnectorRole.SCHEDULER:
            if self.fail_policy:
                log.warning("kv_load_failure_policy is \"fail\": a load pegad cannot finish (the daemon stopped) "
                            "fails its request; set \"kv_load_failure_policy\": \"recompute\" to recompute it")
            self._reqs = {}  # req_id -> _ReqState
            self._matched = {}  # req_id -> (first block, blocks held, pins of the lookup or None, RemotePull or None)
            self._prefetch = {}  # req_id -> Future of a cluster prefetch (done: not tried again)
            self._prefetcher = None
            self._events = []  # BlockStored events of the saves planned since take_events
        else:
            tp_rank, pp_rank = _ranks(vllm_config)
            self.tp_rank = tp_rank
            self.namespace = keys.rank_namespace(self.base, 0 if self.mla else tp_rank, pp_rank)
            self.worker = _vllm_worker.Worker(self.link, self.namespace, self._count,
                                              saves=(not self.mla or tp_rank == 0) and self.produces)
            # bytes per prefetch of a P/D pull, whose copies overlap the next one's READ (0: one prefetch)
            self.worker.pull_chunk_bytes = int(extra.get("pull_chunk_bytes", _vllm_worker.PULL_CHUNK_BYTES))

    def _count(self, **kw):
        with self._stats_mu:
            for k, v in kw.items():
                self.stats[k] += v

    @property
    def requires_kv_delivery(self):
        """A best-effort cache: a dropped save is a later miss, never a loss."""
        return False

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config):
        """No layer hook is needed (loads finish before the request runs,
        saves are taken in wait_for_save), so full CUDA graphs are fine."""
        return False

    # ---------------------------------------------------------------- scheduler

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """Tokens beyond num_computed_tokens that every rank can load: whole
        blocks, never the prompt's last token (vLLM must compute it), but
        for a P/D pull, asynchronous as NixlConnector's, which covers every
        full prompt block: vLLM's scheduler then computes the last token
        again (_vllm_pd.pull_limit). None
        while a cluster prefetch for the request runs. Under the recompute
        policy no pin and no state beyond a memo of the answer; under fail
        the counted prefix is pinned (a later call replaces the pin)."""
        bs = self.block_size
        start = num_computed_tokens // bs
        limit = min(len(request.block_hashes), (request.num_tokens - 1) // bs)
        rid = request.request_id
        self._drop_match(rid)
        pd_limit = _vllm_pd.pull_limit(request, bs)
        if self.consumes and pd_limit > start:
            remote = self._remote(request, start, pd_limit)
            if remote is not None:
                n, pull = remote
                self._matched[rid] = (start, n, None, pull)
                tokens = max(0, (start + n) * bs - num_computed_tokens)
                return tokens, tokens > 0  # always asynchronous: the workers pull, then load
        if limit <= start:
            return 0, False
        fut = self._prefetch.get(rid)
        if fut is not None and not fut.done():
            return None, False
        hashes = [keys.hash_bytes(h) for h in request.block_hashes[start:limit]]
        client = self.link.get()
        n, pins = 0, None
        if client is not None:
            try:
                if self.fail_policy and self.pin and hasattr(client, "lookup_pin"):
                    n, pins = self._lookup_pinned(client, hashes)
                else:
                    n = _engine.prefix(client, self.namespaces, hashes)
            except _engine.FAILURES as e:
                self.link.failed(client, e)
                n, pins = 0, None
        self._count(lookups=1, hit_blocks=n)
        if self.cluster and client is not None and n < len(hashes) and fut is None:
            pre = None
            if self._elsewhere(client, hashes, n):
                pre = self._start_prefetch(client, hashes[n:])
            elif self.cluster_wait > 0:  # the index may not list it yet: wait for it off this thread
                pre = self._start_prefetch(client, hashes[n:], chain=(hashes, n))
            if pre is not None:
                _unpin(pins)
                self._prefetch[rid] = pre
                return None, False
        self._matched[rid] = (start, n, pins, None)
        tokens = max(0, (start + n) * bs - num_computed_tokens)
        return tokens, self.load_async and tokens > 0

    def _remote(self, request, start, limit):
        """A consumer's request with the producer's parameters: (blocks from
        start to pull and load, RemotePull), or None (no P/D parameters, or
        refused ones: counted, and the request is served as any other).
        Only one pull per request, as vLLM's NixlConnector: a request that
        comes back (preempted) finds the pulled blocks on this node."""
        params = getattr(request, "kv_transfer_params", None)
        try:
            out = _vllm_pd.consumer_pull(params, request, self.base, self.namespaces, start, limit,
                                         self.pull_timeout)
        except _vllm_pd.Refused as e:
            log.warning("request %s: P/D parameters refused, recomputing: %s", request.request_id, e)
            self._count(pd_refused_params=1)
            params["do_remote_prefill"] = False
            return None
        return out

    def _lookup_pinned(self, client, hashes):
        """LOOKUP_PIN on every rank's namespace: the prefix all of them
        pinned, and {namespace: Pin}."""
        n, pins = len(hashes), {}
        try:
            for ns in self.namespaces:
                pin = pins[ns] = client.lookup_pin(ns, hashes[:n])
                n = min(n, pin.n)
        except BaseException:
            _unpin(pins)
            raise
        return n, pins

    def _drop_match(self, rid):
        m = self._matched.pop(rid, None)
        if m is not None:
            _unpin(m[2])

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
        tokens); a later call for the request (vLLM's second one after an
        asynchronous load) only updates its blocks."""
        rid = request.request_id
        block_ids = list(blocks.get_block_ids()[0])
        st = self._reqs.get(rid)
        if st is None:
            st = self._reqs[rid] = _ReqState(request, block_ids, 0)
        elif block_ids:
            st.block_ids = block_ids
        m = self._matched.pop(rid, None)
        start, n, pins, remote = m if m is not None else (0, 0, None, None)
        if remote is not None:
            request.kv_transfer_params["do_remote_prefill"] = False  # one pull per request
        n = min(n, (max(num_external_tokens, 0) + self.block_size - 1) // self.block_size)
        if n <= 0 or len(block_ids) < start + n:
            _unpin(pins)
            return
        hashes = [keys.hash_bytes(h) for h in request.block_hashes[start:start + n]]
        if remote is not None:
            tokens = None  # nothing here to pin yet: the workers pull, then lease
        elif pins is not None:
            st.pins.extend(pins.values())
            tokens = {ns: p.token for ns, p in pins.items()}
        else:
            tokens = self._pin_ranks(st, hashes)
        st.load = BlockRun(rid, block_ids[start:start + n], hashes, tokens, remote)
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
        """This step's loads (every one update_state_after_alloc recorded,
        scheduled or waiting for its asynchronous load) and saves: the
        blocks of each scheduled request that are full once the step ran,
        publishable, and not stored yet."""
        meta = PegadConnectorMetadata(sync=not self.load_async)
        for st in self._reqs.values():
            if st.load is not None:
                meta.loads.append(st.load)
                st.load = None
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
        if self.produces:  # a kv_consumer saves nothing
            for rid, ncomp in computed.items():
                self._plan_save(meta, self._reqs[rid], ncomp, scheduler_output.num_scheduled_tokens.get(rid, 0))
        return meta

    def _plan_save(self, meta, st, ncomp, scheduled):
        # A request rolled back (a failed load) recomputes and saves again.
        st.saved = min(st.saved, ncomp // self.block_size)
        req = st.request
        full = (ncomp + scheduled) // self.block_size
        publishable = getattr(req, "num_publishable_block_hashes", None)
        full = min(full, len(req.block_hashes), len(st.block_ids), publishable if publishable is not None else full)
        if full <= st.saved:
            return
        hashes = [keys.hash_bytes(h) for h in req.block_hashes[st.saved:full]]
        meta.saves.append(BlockRun(req.request_id, st.block_ids[st.saved:full], hashes,
                                   handoff=_vllm_pd.wants_decode(req)))
        parent = keys.hash_bytes(req.block_hashes[st.saved - 1]) if st.saved > 0 else None
        tokens = list(getattr(req, "all_token_ids", ()) or ())[st.saved * self.block_size:full * self.block_size]
        self._events.append(_vllm_stats.block_stored(hashes, parent, tokens, self.block_size))
        st.saved = full

    def request_finished(self, request, block_ids):
        """Forget the request. Every publishable full block was saved by the
        step that filled it, so the blocks can be freed now: False. The
        parameters are None, or, for a producer's request with
        do_remote_decode, what the consumer pulls (_vllm_pd.producer_params):
        its prompt's blocks, handed off on this node's pegad."""
        rid = request.request_id
        st = self._reqs.pop(rid, None)
        if st is not None and st.load is not None:  # pinned for a load never handed to the workers
            _unpin(st.pins)
        self._drop_match(rid)
        self._prefetch.pop(rid, None)
        if not (self.produces and _vllm_pd.wants_decode(request) and _vllm_pd.finished_ok(request)):
            return False, None
        return False, self._handoff(request)

    def _handoff(self, request):
        """Hand the request's prompt blocks off for a consumer: the
        parameters, or None when none can be (counted; the decode then
        recomputes the prompt)."""
        nb = _vllm_pd.prompt_blocks(request, self.block_size)
        hashes = [keys.hash_bytes(h) for h in request.block_hashes[:nb]]
        client = self.link.get()
        taken, n = None, 0
        if client is not None and hashes:
            try:
                taken, n = _vllm_pd.handoff(client, self.namespaces, hashes, self.handoff_ttl, self.handoff_wait)
            except errors.InvalidArgument as e:  # e.g. a handoff_ttl over the daemon's cap: the link is fine
                log.error("handoff refused: %s", e)
            except _engine.FAILURES as e:
                self.link.failed(client, e)
        if not taken:
            log.warning("request %s: no block of its prompt to hand off, the decode recomputes it",
                        request.request_id)
            self._count(pd_handoff_failed=1)
            return None
        self._count(pd_handoffs=1, pd_handoff_blocks=n)
        mc, pc = self._vllm_config.model_config, self._vllm_config.parallel_config
        return _vllm_pd.producer_params(request, taken, self.base, hashes[:n], self.block_size,
                                        pc.tensor_parallel_size, pc.pipeline_parallel_size, self.mla, mc.model)

    def request_finished_all_groups(self, request, block_ids):
        """SupportsHMA: the one KV cache group's blocks (more are refused at
        start-up)."""
        return self.request_finished(request, block_ids[0] if block_ids else [])

    def take_events(self):
        """BlockStored events of the blocks planned for saving since the
        last call (a save the daemon drops later is a miss, not retracted)."""
        out, self._events = self._events, []
        return out

    # ---------------------------------------------------------------- worker

    def register_kv_caches(self, kv_caches):
        """kv_caches: layer name -> that layer's paged cache in any layout
        pegad._device resolves (torch on CUDA or the CPU, or numpy), in
        model order."""
        mc, pc = self._vllm_config.model_config, self._vllm_config.parallel_config
        heads = _call(mc, "get_num_kv_heads", None, pc)
        if heads is None:
            total = _call(mc, "get_total_num_kv_heads", None)
            heads = total // pc.tensor_parallel_size if total else None
        nb = getattr(self._kv_cache_config, "num_blocks", None)
        self.worker.register(kv_caches, self.block_size, None if self.mla else heads,
                             _call(mc, "get_head_size", None) if not self.mla else None, nb)
        self.block_bytes = self.worker.block_bytes

    def start_load_kv(self, forward_context, **kwargs):
        """Start the step's loads: synchronous ones inline (the runner calls
        this before the forward then), asynchronous ones on the load thread
        (the runner may call this after the forward)."""
        meta = self._connector_metadata
        if meta is not None and meta.loads:
            self.worker.start_loads(meta.loads, meta.sync)

    def wait_for_layer_load(self, layer_name):
        """Nothing: a load is complete before its request runs."""

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        """Nothing: saves are taken in wait_for_save, which graph replay
        cannot skip."""

    def wait_for_save(self):
        """Save the step's full blocks (the forward wrote them); the commit
        runs on the save thread."""
        meta = self._connector_metadata
        if meta is not None and meta.saves:
            self.worker.save(meta.saves)

    def get_finished(self, finished_req_ids):
        """Requests whose asynchronous load ended (saves never hold vLLM's
        blocks)."""
        return None, self.worker.finished()

    def get_block_ids_with_load_errors(self):
        """Block ids whose load failed since the last call (vLLM recomputes
        or fails them, by kv_load_failure_policy)."""
        return self.worker.take_errors()

    def get_kv_connector_stats(self):
        """The counters' growth since the last call, or None when none grew."""
        with self._stats_mu:
            now = dict(self.stats)
        delta = {k: now[k] - self._reported[k] for k in now if now[k] != self._reported[k]}
        if not delta:
            return None
        self._reported = now
        return _vllm_stats.make_stats(delta)

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        return _vllm_stats.make_stats(data or {})

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return _vllm_stats.make_prom(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def flush(self, timeout=None):
        """Wait until the queued loads and saves are done (tests, shutdown)."""
        if self.role == KVConnectorRole.WORKER:
            self.worker.flush(timeout)

    def shutdown(self):
        if self.role == KVConnectorRole.WORKER:
            self.worker.shutdown()
        elif self._prefetcher is not None:
            self._prefetcher.shutdown(wait=False)
        self.link.close()


def _unpin(pins):
    """Release the scheduler's pins (dict or list of Pin); quietly, they end
    at their lease timeout anyway."""
    for pin in (pins.values() if isinstance(pins, dict) else pins or ()):
        try:
            pin.release()
        except _engine.FAILURES:
            pass
