"""pegad.sglang: an SGLang HiCache storage backend (HiCacheStorage) on the
node's pegad, with the v1 zero-copy calls for the page_first and layer_first
host-pool layouts.

    python -m sglang.launch_server --model-path MODEL --enable-hierarchical-cache \\
        --hicache-storage-backend dynamic \\
        --hicache-storage-backend-extra-config '{"backend_name": "pegad",
            "module_path": "pegad.sglang", "class_name": "PegadStorage",
            "socket": "/run/pegad/pegad.sock"}'

Written against sgl-project/sglang python/sglang/srt/mem_cache/
hicache_storage.py at commit 001067fffe33427bee0ed2f007fb7551a1d76b44 (the
test stub pins the signatures); the host pool layouts are MHATokenToKVPoolHost's:
kv_buffer is [2, layer_num, size, head_num, head_dim] (layer_first) or
[2, size, layer_num, head_num, head_dim] (page_first), and host_indices are
token slots, page_size consecutive ones per key.

A page is one pegad block of one slot: the K segment then the V segment,
each the page's bytes in the pool's layout order (page_first: [page, layer,
head, dim], one contiguous run per segment; layer_first: [layer, page,
head, dim], gathered per layer). The layout is part of the namespace, so
engines with different layouts never read each other's bytes. Each TP rank
stores under its own namespace; SGLang takes the minimum of batch_exists
over the TP group itself. MLA host pools (one latent buffer, no K/V pair)
are refused by register_mem_pool_host.

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

__all__ = ["PegadStorage", "UPSTREAM_COMMIT"]

UPSTREAM_COMMIT = "001067fffe33427bee0ed2f007fb7551a1d76b44"
LAYOUTS = ("page_first", "layer_first")

log = logging.getLogger("pegad.sglang")


class PegadStorage(HiCacheStorage):
    """HiCacheStorage on pegad; see the module doc."""

    def __init__(self, storage_config, kwargs=None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        extra.update(kwargs or {})
        self.config = storage_config
        self.link = _engine.Link(extra.get("socket") or os.environ.get("PEGAD_SOCKET") or DEFAULT_SOCKET,
                                 timeout=float(extra.get("timeout", 5.0)), retry=float(extra.get("retry", 1.0)))
        self._extra_namespace = extra.get("namespace")
        self.mem_pool_host = None
        self.namespace = None

    def register_mem_pool_host(self, mem_pool_host):
        """The host pool the v1 calls read and write; fixes the namespace."""
        self.mem_pool_host = mem_pool_host
        layout = mem_pool_host.layout
        if layout not in LAYOUTS:
            raise ValueError(f"pegad.sglang supports the {' and '.join(LAYOUTS)} layouts, not {layout!r}")
        buf = _engine.as_numpy(mem_pool_host.kv_buffer)
        if buf.ndim != 5 or buf.shape[0] != 2 or not buf.flags.c_contiguous:
            raise ValueError(f"host kv_buffer of shape {buf.shape}: want a C-contiguous MHA pool")
        self._buf = buf
        self._page = mem_pool_host.page_size
        self._layers = buf.shape[2] if layout == "page_first" else buf.shape[1]
        self._seg = self._page * self._layers * buf.shape[3] * buf.shape[4] * buf.itemsize  # bytes of K (or V)
        c = self.config
        mla = bool(getattr(c, "is_mla_model", False))
        base = self._extra_namespace or keys.model_namespace(
            c.model_name or "model", buf.dtype, layout, 1 if mla else c.tp_size, c.pp_size, buf.dtype, self._page,
            engine="sglang", layers=self._layers, heads=buf.shape[3], head_dim=buf.shape[4])
        self.namespace = keys.rank_namespace(base, 0 if mla else c.tp_rank, c.pp_rank)

    # --- the page <-> block byte mapping ---------------------------------

    def _page_views(self, start):
        """K and V of the page starting at token slot start, as arrays in
        the block's byte order."""
        if self.mem_pool_host.layout == "page_first":
            return self._buf[0, start:start + self._page], self._buf[1, start:start + self._page]
        return self._buf[0, :, start:start + self._page], self._buf[1, :, start:start + self._page]

    def _block_views(self, view):
        """A block's buffer as (K, V) arrays shaped like _page_views."""
        k, v = self._page_views(0)
        a = np.frombuffer(view, self._buf.dtype)
        half = a.size // 2
        return a[:half].reshape(k.shape), a[half:].reshape(v.shape)

    def _starts(self, keys_, host_indices):
        idx = host_indices.tolist() if hasattr(host_indices, "tolist") else list(host_indices)
        if len(idx) != len(keys_) * self._page:
            raise ValueError(f"{len(idx)} host indices for {len(keys_)} pages of {self._page}")
        return idx[::self._page]

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
        readers = []
        for i, r in enumerate(res):
            if isinstance(r, Exception):
                continue
            readers.append((i, r))
            if len(r.slots) != 1 or r.slots[0].v is None or r.size != 2 * self._seg:
                continue  # not a page of this layout: recompute it
            # By segment: a page fetched from a peer may have K and V apart.
            k, v = self._page_views(starts[i])
            k[...] = np.frombuffer(r.slots[0].k, self._buf.dtype).reshape(k.shape)
            v[...] = np.frombuffer(r.slots[0].v, self._buf.dtype).reshape(v.shape)
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
        stored (or stored already)."""
        out = [False] * len(keys)
        client = self._client()
        if client is None or not keys:
            return out
        starts = self._starts(keys, host_indices)
        try:
            res = client.alloc_batch([(self.namespace, _key(k), 2 * self._seg, [(self._seg, self._seg)])
                                      for k in keys])
            writers = []
            for i, w in enumerate(res):
                if isinstance(w, errors.Exists):
                    out[i] = True
                elif not isinstance(w, Exception):
                    bk, bv = self._block_views(w.buffer)
                    bk[...], bv[...] = self._page_views(starts[i])
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

    # --- the copying calls (SGLang's non-zero-copy path) --------------------

    def get(self, key, target_location=None, target_sizes=None):
        """The block's bytes, into target_location when given (a flat page
        buffer); None when not stored."""
        client = self._client()
        if client is None:
            return None
        try:
            with client.lease(self.namespace, _key(key)) as r:
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
            client.put(self.namespace, _key(key), np.ascontiguousarray(_engine.as_numpy(src)).view(np.uint8))
            return True
        except _engine.FAILURES as e:
            self.link.failed(client, e)
            return False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None):
        vals = values if values is not None else target_locations
        return all(self.set(k, v) for k, v in zip(keys, vals))

    def exists(self, key):
        return self.batch_exists([key]) == 1

    def clear(self):
        """Nothing: pegad's blocks are shared with other engines and evicted
        by its LRU."""

    def close(self):
        self.link.close()


def _key(k):
    return keys.hash_bytes(k)
