"""pegad.sglang: an SGLang HiCache storage backend (HiCacheStorage) on the
node's pegad, on SGLang's zero-copy calls (batch_exists, batch_get_v1,
batch_set_v1) for every CPU host-pool layout but Ascend's.

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "pegad",
            "module_path": "pegad.sglang", "class_name": "PegadStorage",
            "interface_v1": 1, "socket": "/run/pegad/pegad.sock"}'

"interface_v1": 1 is required: without it SGLang copies pages through the
generic batch_get/batch_set calls while it still asks batch_exists, so the
backend refuses to attach without it (ValueError naming the key).

It owns how SGLang's host pages map to pegad blocks and namespaces, and
refuses at registration what it cannot store whole. It must never raise a
daemon failure into SGLang's storage threads (SGLang does not restart
them: a failure is "not stored" / "not loaded", and SGLang recomputes), and
never copy token by token in Python.

Written against sgl-project/sglang python/sglang/srt/mem_cache/
hicache_storage.py at commit 001067fffe33427bee0ed2f007fb7551a1d76b44 (the
test stub pins the signatures); the host pools are pool_host/mha.py's
MHATokenToKVPoolHost and pool_host/mla.py's MLATokenToKVPoolHost. Their
kv_buffer, and one page (page_size token slots from a page-aligned start
s) of it, per layout:

    layout             MHA kv_buffer                  one K (or V) page     MLA kv_buffer
    layer_first        [2, L, size, H, D]             [L, P, H, D] (strided) [L, size, 1, D]
    page_first         [2, size, L, H, D]             [P, L, H, D]           [size, L, 1, D]
    page_first_direct  [2, pages, L, P, H, D]         [L, P, H, D]           [pages, L, P, 1, D]
    page_head          [2, pages, H, P, L, D]         [H, P, L, D]           (no MLA pool)

A page is one pegad block of one slot. MHA: the K segment then the V
segment, each the page in the layout's order above; MLA: one segment, the
latent page (the same orders without the K/V axis). Each segment is one
vectorised numpy copy (one strided gather per page in layer_first). The
layout is part of the namespace, so engines with different layouts never
read each other's bytes. page_first_kv_split (Ascend NPUs: the MLA latent
and rope parts in two buffers) is refused by name.

Namespaces (keys.rank_namespace), from SGLang's storage config (under
attention DP its tp_rank/tp_size are the attention-TP ones; otherwise the
global TP rank, laid out (dp, cp, tp), tp fastest): MHA: one per TP rank
(each holds its heads); SGLang takes the minimum of batch_exists over the
TP group itself. MLA: the latent is the same on every attention-TP rank, so
it is stored once: the namespace has no TP rank ("@mla" for "@tp<r>"), the
first rank of each attention-TP group saves it (the others answer True
without writing) and every rank loads it; an MLA pool split for decode
context parallel (dcp_size > 1, a slice of each page per rank) is refused.
Under attention context parallel (attn_cp_size > 1) each CP rank holds its
own slice of every page, so the CP rank is in the namespace ("@cp<c>.tp<r>",
"@cp<c>.mla") and the CP size in its digest. The digest has the pool's
dtype and the device pool's (SGLang stores fp8 e4m3 and e5m2 alike as
uint8).

Hybrid models (Mamba, SWA, DSA indexer, ... pools through
register_mem_host_pool_v2 or in a HostPoolGroup) are refused there, at
configuration time; the v2 calls serve the KV pool alone (PoolName "kv"),
through the v1 paths. tp_lcm_size (pages split by head for engines of other
TP sizes) is not done, and said so in the log.

When pegad is stopped, batch_exists answers 0, gets and sets report False,
and SGLang recomputes; the client is dialled again at most every "retry"
seconds.
"""

import logging
import os

import numpy as np

from sglang.srt.mem_cache.hicache_storage import HiCacheStorage

from . import _engine, errors, keys
from .client import DEFAULT_SOCKET

__all__ = ["PegadStorage", "UPSTREAM_COMMIT", "LAYOUTS"]

UPSTREAM_COMMIT = "001067fffe33427bee0ed2f007fb7551a1d76b44"
LAYOUTS = ("page_first", "layer_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("page_first", "layer_first", "page_first_direct")
KV_POOL = "kv"  # hicache_storage.PoolName.KV

log = logging.getLogger("pegad.sglang")


def _need_interface_v1(storage_config):
    extra = getattr(storage_config, "extra_config", None) or {}
    if not bool(extra.get("interface_v1", 0)):
        raise ValueError(
            'pegad.sglang needs "interface_v1": 1 in --hicache-storage-backend-extra-config: without it '
            "SGLang copies pages through the generic batch_get/batch_set path, which pegad.sglang does not "
            "serve (it reads and writes SGLang's host pool in place with batch_get_v1/batch_set_v1)")


class PegadStorage(HiCacheStorage):
    """HiCacheStorage on pegad; see the module doc."""

    def __init__(self, storage_config, kwargs=None):
        _need_interface_v1(storage_config)
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        extra.update(kwargs or {})
        self.config = storage_config
        self.link = _engine.Link(extra.get("socket") or os.environ.get("PEGAD_SOCKET") or DEFAULT_SOCKET,
                                 timeout=float(extra.get("timeout", 5.0)), retry=float(extra.get("retry", 1.0)))
        self._extra_namespace = extra.get("namespace")
        self.mem_pool_host = None
        self.namespace = None
        self.saves = True

    # --- configuration ------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host):
        """The host pool the v1 calls read and write; fixes the namespace.
        Raises ValueError for a pool it cannot serve, naming why."""
        c = self.config
        mla = bool(getattr(c, "is_mla_model", False))
        pool = _kv_host_pool(mem_pool_host)
        buf = _check_pool(pool, mla)
        if getattr(c, "should_split_heads", False):
            # tp_lcm_size asks a backend to store page_head pages split by head, so engines of other TP
            # sizes share them; pegad keys by TP size instead, so they are cached, but per TP size.
            log.warning("pegad.sglang: tp_lcm_size is set, but blocks are shared only between engines of "
                        "the same TP size (%s); pages are not split by head", c.tp_size)
        self.mem_pool_host = pool
        self._buf, self._page, self._layout, self._mla = buf, int(pool.page_size), pool.layout, mla
        segs = self._page_views(0)
        self._shapes = [s.shape for s in segs]
        self._sizes = [s.size * buf.itemsize for s in segs]
        self.namespace = self._namespace_for(pool, segs[0].shape)
        self.saves = not mla or _saves_latent(c)

    def _namespace_for(self, pool, seg_shape):
        """This rank's namespace (keys.rank_namespace) of the pool's model
        configuration; the module doc says which factors go in."""
        c, mla, layout = self.config, self._mla, self._layout
        layers, heads, head_dim = {
            "page_first": lambda s: (s[1], s[2], s[3]),
            "layer_first": lambda s: (s[0], s[2], s[3]),
            "page_first_direct": lambda s: (s[0], s[2], s[3]),
            "page_head": lambda s: (s[2], s[0], s[3]),
        }[layout](seg_shape)
        cp_size = int(getattr(c, "attn_cp_size", 1) or 1)
        cp_rank = int(getattr(c, "attn_cp_rank", 0) or 0)
        shape = dict(engine="sglang", layers=layers, heads=heads, head_dim=head_dim)
        if mla:
            shape["kv"] = "mla-latent"
        if cp_size > 1:
            shape["attn_cp_size"] = cp_size
        # The pool's storage dtype (torch's bf16 and fp16 both come from as_numpy as int16), and the
        # cache's own: SGLang stores both fp8 formats as uint8 (KVCache.store_dtype), and e4m3 bytes
        # read as e5m2 are wrong values. The two agree for every other dtype, so those digests are
        # what they were before the cache dtype was taken from the device pool.
        dtype = str(getattr(pool.kv_buffer, "dtype", self._buf.dtype))
        cache_dtype = str(getattr(getattr(pool, "device_pool", None), "dtype", None) or dtype)
        base = self._extra_namespace or keys.model_namespace(
            c.model_name or "model", dtype, layout, 1 if mla else c.tp_size, c.pp_size, cache_dtype, self._page,
            **shape)
        return keys.rank_namespace(base, None if mla else int(c.tp_rank), c.pp_rank,
                                   cp_rank if cp_size > 1 else None)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """The v2 registration: the KV pool is served as by
        register_mem_pool_host; any other pool (a hybrid model's Mamba, SWA,
        indexer or draft pool) is refused here, at configuration time."""
        name = str(getattr(host_pool_name, "value", host_pool_name))
        if name != KV_POOL:
            raise ValueError(f"pegad.sglang stores the KV pool only, not the {name!r} pool of a hybrid model: "
                             "run this model without --hicache-storage-backend, or with a backend that "
                             "implements the v2 pools")
        self.register_mem_pool_host(host_pool)
        if not hasattr(self, "registered_pools"):
            self.registered_pools = {}
        self.registered_pools[host_pool_name] = host_pool

    # --- the page <-> block byte mapping ---------------------------------

    def _page_views(self, start):
        """The segments (K, V; MLA: the latent) of the page starting at token
        slot start, as arrays in the block's byte order."""
        b, p, lay = self._buf, self._page, self._layout
        if self._mla:
            if lay == "page_first":
                return (b[start:start + p],)
            if lay == "layer_first":
                return (b[:, start:start + p],)
            return (b[start // p],)
        if lay == "page_first":
            return b[0, start:start + p], b[1, start:start + p]
        if lay == "layer_first":
            return b[0, :, start:start + p], b[1, :, start:start + p]
        return b[0, start // p], b[1, start // p]  # page_first_direct, page_head

    def _block_segments(self, segs):
        """A block's segments (memoryviews) as arrays shaped like _page_views."""
        return [np.frombuffer(s, self._buf.dtype).reshape(shape) for s, shape in zip(segs, self._shapes)]

    def _starts(self, keys_, host_indices):
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        if len(idx) != len(keys_) * self._page:
            raise ValueError(f"{len(idx)} host indices for {len(keys_)} pages of {self._page}")
        starts = idx[::self._page]
        if any(s % self._page for s in starts):
            raise ValueError(f"host pages must start at multiples of the page size {self._page}: {starts}")
        return starts

    def _slots(self):
        return [(self._sizes[0], self._sizes[1] if len(self._sizes) > 1 else 0)]

    def _client(self):
        return self.link.get()

    # --- v1 zero-copy ------------------------------------------------------

    def batch_exists(self, keys, extra_info=None):
        """Consecutive keys stored, from the first (no pin, no LRU touch)."""
        client = self._client()
        if client is None or not keys:
            return 0
        try:
            return _engine.lookup(client, self.namespace, [_key(k) for k in keys])
        except _engine.FAILURES as e:
            self.link.failed(client, e)
            return 0

    def batch_get_v1(self, keys, host_indices, extra_info=None):
        """Copy each key's block into its host page: one lease and one
        release round trip. Per key: True when loaded."""
        out = [False] * len(keys)
        client = self._client()
        if client is None or not keys:
            return out
        starts = self._starts(keys, host_indices)
        try:
            res = client.lease_batch(self.namespace, [_key(k) for k in keys])
        except _engine.FAILURES as e:
            self.link.failed(client, e)
            return out
        nseg = len(self._sizes)
        readers = []
        for i, r in enumerate(res):
            if isinstance(r, Exception):
                continue
            readers.append((i, r))
            segs = [r.slots[0].k, r.slots[0].v][:nseg] if len(r.slots) == 1 else None
            if segs is None or (nseg == 2) != (r.slots[0].v is not None) or \
                    [s.nbytes for s in segs] != self._sizes:
                continue  # not a page of this layout: recompute it
            # By segment: a page fetched from a peer may have K and V apart.
            for dst, src in zip(self._page_views(starts[i]), self._block_segments(segs)):
                dst[...] = src
            out[i] = True
        for i, r in readers:
            try:
                r.release()
            except errors.LeaseEnded:
                out[i] = False  # the memory may have been reused during the copy
            except _engine.FAILURES as e:
                self.link.failed(client, e)
                out[i] = False
        return out

    def batch_set_v1(self, keys, host_indices, extra_info=None):
        """Store each host page under its key, written in place into the
        pool (one alloc and one commit round trip). Per key: True when
        stored (or stored already). An MLA rank that does not save answers
        True: its attention-TP group's first rank stores the latent."""
        if not self.saves:
            self._starts(keys, host_indices)
            return [True] * len(keys)
        out = [False] * len(keys)
        client = self._client()
        if client is None or not keys:
            return out
        starts = self._starts(keys, host_indices)
        size, slots = sum(self._sizes), self._slots()
        try:
            res = client.alloc_batch([(self.namespace, _key(k), size, slots) for k in keys])
            writers = []
            for i, w in enumerate(res):
                if isinstance(w, errors.Exists):
                    out[i] = True
                elif not isinstance(w, Exception):
                    mv = w.buffer
                    segs, off = [], 0
                    for n in self._sizes:
                        segs.append(mv[off:off + n])
                        off += n
                    for dst, src in zip(self._block_segments(segs), self._page_views(starts[i])):
                        dst[...] = src
                    writers.append((i, w))
            if writers:
                try:
                    client.commit_batch([w for _, w in writers])
                except errors.PegadError:
                    pass  # per writer below
                for i, w in writers:
                    out[i] = w._commit_error is None or isinstance(w._commit_error, errors.Exists)
        except _engine.FAILURES as e:
            self.link.failed(client, e)
        return out

    # --- v2: the KV pool only ------------------------------------------------

    def _kv_transfers(self, transfers):
        for t in transfers or []:
            name = str(getattr(t.name, "value", t.name))
            if name != KV_POOL:
                raise ValueError(f"pegad.sglang stores the KV pool only, not {name!r}")
        return [t for t in transfers or []]

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        from sglang.srt.mem_cache.hicache_storage import PoolTransferResult
        self._kv_transfers(pool_transfers)
        return PoolTransferResult(self.batch_exists(keys, extra_info), {})

    def batch_get_v2(self, transfers, extra_info=None):
        return {t.name: self.batch_get_v1(t.keys, t.host_indices, extra_info)
                for t in self._kv_transfers(transfers)}

    def batch_set_v2(self, transfers, extra_info=None):
        return {t.name: self.batch_set_v1(t.keys, t.host_indices, extra_info)
                for t in self._kv_transfers(transfers)}

    # --- the copying calls (SGLang's generic path) ---------------------------
    # Not used for the KV pool (interface_v1 is required); kept for the
    # abstract interface and SGLang's generic draft-pool path. They store
    # under their own namespace, so batch_exists never answers for a block
    # batch_get_v1 cannot read.

    def _flat_namespace(self):
        return self.namespace + ".flat"

    def get(self, key, target_location=None, target_sizes=None):
        """The block's bytes, into target_location when given (a flat page
        buffer); None when not stored."""
        client = self._client()
        if client is None:
            return None
        try:
            with client.lease(self._flat_namespace(), _key(key)) as r:
                src = np.frombuffer(r.buffer, np.uint8) if r.buffer is not None else np.frombuffer(
                    b"".join(bytes(s) for s in r.segments()), np.uint8)
                if target_location is None:
                    return src.copy()
                dst = _engine.as_numpy(target_location).reshape(-1).view(np.uint8)
                dst[:src.size] = src
                return target_location
        except errors.NotFound:
            return None
        except _engine.FAILURES as e:
            self.link.failed(client, e)
            return None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        locs = target_locations if target_locations is not None else [None] * len(keys)
        return [self.get(k, t) for k, t in zip(keys, locs)]

    def set(self, key, value=None, target_location=None, target_sizes=None):
        src = value if value is not None else target_location
        client = self._client()
        if client is None or src is None:
            return False
        try:
            client.put(self._flat_namespace(), _key(key),
                       np.ascontiguousarray(_engine.as_numpy(src)).view(np.uint8))
            return True
        except _engine.FAILURES as e:
            self.link.failed(client, e)
            return False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        vals = values if values is not None else target_locations
        return all(self.set(k, v) for k, v in zip(keys, vals))

    def exists(self, key):
        """Whether the copying calls stored key (their own namespace)."""
        client = self._client()
        if client is None:
            return False
        try:
            return _engine.lookup(client, self._flat_namespace(), [_key(key)]) == 1
        except _engine.FAILURES as e:
            self.link.failed(client, e)
            return False

    def clear(self):
        """Nothing: pegad's blocks are shared with other engines and evicted
        by its LRU."""

    def close(self):
        self.link.close()


def _kv_host_pool(mem_pool_host):
    """The KV pool of what SGLang registers: the pool itself, or a
    HostPoolGroup's anchor. A group holding any other pool (a hybrid model's
    Mamba, SWA or indexer state) is refused: pegad.sglang would store its
    KV pages alone, and SGLang would load KV without the state it needs."""
    anchor = getattr(mem_pool_host, "anchor_entry", None)
    if anchor is None:
        return mem_pool_host
    others = [str(getattr(e.name, "value", e.name)) for e in getattr(mem_pool_host, "entries", [anchor])]
    others = [n for n in others if n != KV_POOL]
    if others:
        raise ValueError(f"pegad.sglang stores the KV pool only, not the {', '.join(others)} pool(s) of this "
                         "hybrid model: run it without --hicache-storage-backend, or with a backend that "
                         "implements the v2 pools")
    return anchor.host_pool


_DIMS = {("page_first", False): 5, ("layer_first", False): 5, ("page_first_direct", False): 6,
         ("page_head", False): 6, ("page_first", True): 4, ("layer_first", True): 4,
         ("page_first_direct", True): 5}


def _check_pool(pool, mla):
    """The pool's kv_buffer as a numpy array, after checking it is SGLang's
    pool of its layout (the module doc's table); ValueError otherwise."""
    layout = pool.layout
    if layout == "page_first_kv_split":
        raise ValueError("pegad.sglang does not serve the page_first_kv_split host layout (SGLang's Ascend "
                         "NPU MLA pool, latent and rope in two buffers): use --hicache-mem-layout "
                         f"{' or '.join(MLA_LAYOUTS)}")
    supported = MLA_LAYOUTS if mla else LAYOUTS
    if layout not in supported:
        raise ValueError(f"pegad.sglang serves the {', '.join(supported)} layouts"
                         f"{' of an MLA pool' if mla else ''}, not {layout!r}")
    if mla and int(getattr(pool, "dcp_size", 1) or 1) > 1:
        # Decode context parallel splits each page's tokens over the ranks (the host pool holds
        # page_size // dcp_size of them): the latent is then not the same on every rank, and
        # storing it once would lose the other ranks' slices.
        raise ValueError(f"pegad.sglang stores an MLA latent once for every rank; this pool is split for "
                         f"decode context parallel (dcp_size {pool.dcp_size}), each rank holding its own "
                         "slice of a page: run without --dcp-size or without --hicache-storage-backend")
    if isinstance(pool.kv_buffer, (tuple, list)):
        raise ValueError("pegad.sglang does not serve host pools with K and V in separate buffers "
                         "(head_dim != v_head_dim)")
    buf = _engine.as_numpy(pool.kv_buffer)
    page = int(pool.page_size)
    ok = buf.ndim == _DIMS[(layout, mla)] and buf.flags.c_contiguous and (mla or buf.shape[0] == 2)
    if ok and layout in ("page_first_direct", "page_head"):  # a page axis of page_size slots
        ok = buf.shape[2 if mla else 3] == page
    if not ok:
        raise ValueError(f"{'MLA' if mla else 'MHA'} host kv_buffer of shape {buf.shape} "
                         f"({'C' if buf.flags.c_contiguous else 'not C'}-contiguous) is not SGLang's "
                         f"{layout} pool of page size {page}")
    return buf


def _saves_latent(c):
    """Whether this rank stores the MLA latent: the first rank of its
    attention-TP group (the others hold the same latent). SGLang's
    storage config (cache_controller._generate_storage_config) carries the
    attention-TP rank and size under attention DP (dp_size > 1), and the
    global TP rank otherwise, laid out (dp, cp, tp) with tp fastest
    (dp_attention.compute_dp_attention_world_info). A rank that guesses
    wrong only stores a latent twice (the second alloc finds it there)."""
    tp_size, tp_rank = int(c.tp_size), int(c.tp_rank)
    dp_size = int(getattr(c, "dp_size", 1) or 1)
    cp_size = int(getattr(c, "attn_cp_size", 1) or 1)
    attn_tp = tp_size if dp_size > 1 else max(1, tp_size // cp_size)
    return tp_rank % attn_tp == 0


def _key(k):
    return keys.hash_bytes(k)
