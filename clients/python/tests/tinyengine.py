"""A real, tiny inference engine on the CPU for the connector tests.

A decoder-only transformer in numpy (random weights from a fixed seed) with a
paged KV cache per layer, either numpy in FlashAttention's NHD layout
[2, num_blocks, block_size, heads, head_dim] or torch in any of vLLM's
layouts (KV(): NHD, HND, FlashInfer, packed K/V, MLA's latent, all layers
in one tensor) and cache dtypes; vLLM's chained block hashes (sha256 over
pickle, as vLLM's "sha256" prefix_caching_hash_algo), and a driver that
calls a KVConnectorBase_V1 in the order of vLLM's runner at the pinned
commit (v1/worker/kv_connector_model_runner_mixin.py):

    scheduler: get_num_new_matched_tokens (again while it answers None),
               update_state_after_alloc, build_connector_meta; a request
               with an asynchronous load waits (steps without a forward)
               until every worker's get_finished names it, then
               update_state_after_alloc again with 0 external tokens
    workers:   bind_connector_metadata, start_load_kv BEFORE the forward
               only when the step has synchronous loads (else after it),
               per layer wait_for_layer_load / attention / save_kv_layer
               (skipped under full CUDA graphs: graphs="full"),
               wait_for_save, get_finished, get_block_ids_with_load_errors,
               clear_connector_metadata
    scheduler: request_finished; workers: get_finished({req_id})

A failed load follows kv_load_failure_policy: "recompute" rolls the request
back to its first failed block, "fail" (vLLM's default) ends it
(RequestFailed). Each tensor-parallel rank is its own worker process
holding its share of the heads (MLA: every rank holds the whole latent);
the attention output is summed over ranks through pipes (the all-reduce).
"""

import hashlib
import multiprocessing as mp
import pickle
import sys
import time
import traceback
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

VOCAB, D_MODEL, LAYERS, HEADS, HEAD_DIM, FFN, LATENT = 97, 32, 2, 4, 8, 64, 16
NONE_HASH = hashlib.sha256(b"pegad tinyengine root").digest()  # vLLM: from PYTHONHASHSEED or random


def block_hashes(tokens, block_size):
    """vLLM's chained hashes of the full blocks of tokens."""
    out, parent = [], NONE_HASH
    for i in range(len(tokens) // block_size):
        blk = tuple(tokens[i * block_size:(i + 1) * block_size])
        parent = hashlib.sha256(pickle.dumps((parent, blk, None), protocol=pickle.HIGHEST_PROTOCOL)).digest()
        out.append(parent)
    return out


class Model:
    """The model's share on one TP rank: heads [r*H/tp, (r+1)*H/tp)."""

    def __init__(self, seed=7, tp_rank=0, tp_size=1):
        rng = np.random.default_rng(seed)
        s = 0.3
        self.embed = rng.standard_normal((VOCAB, D_MODEL)).astype(np.float32)
        self.pos = rng.standard_normal((256, D_MODEL)).astype(np.float32) * s
        hs = slice(tp_rank * HEADS // tp_size * HEAD_DIM, (tp_rank + 1) * HEADS // tp_size * HEAD_DIM)
        self.heads = HEADS // tp_size
        self.layers = []
        for _ in range(LAYERS):
            w = {k: (rng.standard_normal(shape).astype(np.float32) * s) for k, shape in (
                ("q", (D_MODEL, HEADS * HEAD_DIM)), ("k", (D_MODEL, HEADS * HEAD_DIM)),
                ("v", (D_MODEL, HEADS * HEAD_DIM)), ("o", (HEADS * HEAD_DIM, D_MODEL)),
                ("w1", (D_MODEL, FFN)), ("w2", (FFN, D_MODEL)), ("c", (D_MODEL, LATENT)),
                ("uk", (LATENT, HEADS * HEAD_DIM)), ("uv", (LATENT, HEADS * HEAD_DIM)))}
            for k in ("q", "k", "v", "uk", "uv"):
                w[k] = np.ascontiguousarray(w[k][:, hs])
            w["o"] = np.ascontiguousarray(w["o"][hs, :])
            self.layers.append(w)
        self.head = rng.standard_normal((D_MODEL, VOCAB)).astype(np.float32) * s

    def forward(self, tokens, positions, kv, block_table, block_size, allreduce, hooks):
        """Logits of tokens at positions (one request), writing their K/V
        (MLA: latent) into the paged cache kv (a NumpyKV or KV) and
        attending over the cache through block_table."""
        if isinstance(kv, list):  # per layer numpy [2, nb, bs, h, d] arrays (the SGLang test's device pool)
            kv = NumpyKV.over(kv)
        x = self.embed[tokens] + self.pos[positions]
        n = len(tokens)
        end = positions[-1] + 1
        slots = [(block_table[p // block_size], p % block_size) for p in positions]
        nb = (end + block_size - 1) // block_size
        for li, w in enumerate(self.layers):
            name = f"layers.{li}.attn"
            hooks.wait_for_layer_load(name)
            h = _norm(x)
            q = (h @ w["q"]).reshape(n, self.heads, HEAD_DIM)
            if kv.mla:
                c = h @ w["c"]
                for i, (b, o) in enumerate(slots):
                    kv.write(li, b, o, c[i])
            else:
                k = (h @ w["k"]).reshape(n, self.heads, HEAD_DIM)
                v = (h @ w["v"]).reshape(n, self.heads, HEAD_DIM)
                for i, (b, o) in enumerate(slots):
                    kv.write(li, b, o, k[i], v[i])
            hooks.save_kv_layer(name, kv.tensors[li], None)
            if kv.mla:
                lat = kv.read(li, block_table[:nb], end)
                keys = (lat @ w["uk"]).reshape(end, self.heads, HEAD_DIM)
                vals = (lat @ w["uv"]).reshape(end, self.heads, HEAD_DIM)
            else:
                keys, vals = kv.read(li, block_table[:nb], end)
            att = np.einsum("nhd,thd->hnt", q, keys) / np.sqrt(HEAD_DIM)
            mask = np.arange(end)[None, :] > np.asarray(positions)[:, None]
            att = np.where(mask[None], -1e30, att)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            out = np.einsum("hnt,thd->nhd", att, vals).reshape(n, -1) @ w["o"]
            x = x + allreduce(out)
            x = x + np.maximum(_norm(x) @ w["w1"], 0) @ w["w2"]
        return _norm(x) @ self.head


class NumpyKV:
    """The numpy engine's cache: per layer [2, nb, bs, h, d] float32."""
    mla = False

    def __init__(self, num_blocks, block_size, heads):
        self.tensors = [np.zeros((2, num_blocks, block_size, heads, HEAD_DIM), np.float32) for _ in range(LAYERS)]

    @classmethod
    def over(cls, arrays):
        kv = cls.__new__(cls)
        kv.tensors = arrays
        return kv

    def write(self, li, b, o, k, v):
        self.tensors[li][0, b, o] = k
        self.tensors[li][1, b, o] = v

    def read(self, li, blocks, end):
        t = self.tensors[li]
        h = t.shape[3]
        return (t[0, blocks].reshape(-1, h, HEAD_DIM)[:end], t[1, blocks].reshape(-1, h, HEAD_DIM)[:end])


# vLLM's layouts, as its attention backends allocate them: name -> (the
# physical shape, the permutation that gives the logical shape the backend
# hands the connector, the logical form). nb, bs, h, d, L stand for the sizes.
LAYOUTS = {
    "nhd": ("2 nb bs h d", None, "kv_first"),  # FlashAttention
    "hnd": ("2 nb h bs d", (0, 1, 3, 2, 4), "kv_first"),  # FlashAttention, HND strides
    "flashinfer": ("nb 2 bs h d", None, "block_first"),  # FlashInfer, Triton
    "flashinfer_hnd": ("nb 2 h bs d", (0, 1, 3, 2, 4), "block_first"),
    "packed": ("nb h bs 2d", None, "packed"),  # vLLM's CPU backend
    "mla": ("nb bs d", None, "mla"),
    "layers_first": ("L 2 nb bs h d", None, "kv_first"),  # all layers in one tensor: layer l is big[l]
    "cross_layer": ("nb L 2 bs h d", None, "block_first"),  # all layers in one tensor: layer l is big[:, l]
}


class KV:
    """A torch paged cache in one of LAYOUTS, dtype a torch dtype name
    ("float32", "bfloat16", "float16", "uint8": bytes only, no model)."""

    def __init__(self, layout, num_blocks, block_size, heads, dtype="float32", device="cpu", head_dim=None):
        import torch
        self.torch = torch
        self.layout, self.mla = layout, layout == "mla"
        d = head_dim or (LATENT if self.mla else HEAD_DIM)
        self.d, self.h = d, heads
        phys, perm, self.form = LAYOUTS[layout]
        sizes = {"nb": num_blocks, "bs": block_size, "h": heads, "d": d, "2d": 2 * d, "2": 2, "L": LAYERS}
        shape = [sizes[w] for w in phys.split()]
        dt = getattr(torch, dtype)
        if layout == "layers_first":
            big = torch.zeros(shape, dtype=dt, device=device)
            self.tensors = [big[i] for i in range(LAYERS)]
        elif layout == "cross_layer":
            big = torch.zeros(shape, dtype=dt, device=device)
            self.tensors = [big[:, i] for i in range(LAYERS)]
        else:
            self.tensors = []
            for _ in range(LAYERS):
                t = torch.zeros(shape, dtype=dt, device=device)
                self.tensors.append(t.permute(*perm) if perm else t)

    def write(self, li, b, o, k, v=None):
        t, d = self.tensors[li], self.d
        k = self.torch.from_numpy(np.ascontiguousarray(k)).to(t.dtype)
        v = self.torch.from_numpy(np.ascontiguousarray(v)).to(t.dtype) if v is not None else None
        if self.form == "kv_first":
            t[0, b, o], t[1, b, o] = k, v
        elif self.form == "block_first":
            t[b, 0, o], t[b, 1, o] = k, v
        elif self.form == "packed":
            t[b, :, o, :d], t[b, :, o, d:] = k, v
        else:
            t[b, o] = k

    def logical(self, li):
        """Layer li as [nb, 2, bs, h, d] (MLA [nb, bs, d]): the stored order
        of each block, built by indexing (not from strides)."""
        t, d, torch = self.tensors[li], self.d, self.torch
        if self.form == "kv_first":
            return torch.stack([t[0], t[1]], 1)
        if self.form == "block_first":
            return t.clone()
        if self.form == "packed":
            return torch.stack([t[..., :d], t[..., d:]], 1).permute(0, 1, 3, 2, 4).contiguous()
        return t.clone()

    def read(self, li, blocks, end):
        x = self.logical(li)[list(blocks)].float().cpu()
        if self.mla:
            return x.reshape(-1, self.d)[:end].numpy()
        k = x[:, 0].reshape(-1, self.h, self.d)[:end].numpy()
        return k, x[:, 1].reshape(-1, self.h, self.d)[:end].numpy()


def _norm(x):
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)


class _NoConnector:
    def wait_for_layer_load(self, name):
        pass

    def save_kv_layer(self, name, kv_layer, attn_metadata):
        pass


# --- vLLM's objects the connector reads (attribute names as upstream) ------

@dataclass
class Request:
    request_id: str
    prompt_token_ids: list
    block_size: int
    all_token_ids: list = field(default_factory=list)
    num_publishable_block_hashes: int = None
    block_hashes: list = field(default_factory=list)
    kv_transfer_params: dict = None  # vLLM: from the request body (P/D), None without

    def __post_init__(self):
        self.all_token_ids = list(self.prompt_token_ids)
        self.rehash()

    @property
    def num_tokens(self):
        return len(self.all_token_ids)

    def rehash(self):
        self.block_hashes = block_hashes(self.all_token_ids, self.block_size)


class KVCacheBlocks:
    def __init__(self, ids):
        self._ids = list(ids)

    def get_block_ids(self):
        return (self._ids,)


def _sched_out(new=(), cached=(), scheduled=None):
    """A SchedulerOutput with vLLM's field names (v1/core/sched/output.py)."""
    return SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id=r, prompt_token_ids=p, block_ids=(b,), num_computed_tokens=c)
                            for r, p, b, c in new],
        scheduled_cached_reqs=SimpleNamespace(req_ids=[c[0] for c in cached], new_block_ids=[c[1] for c in cached],
                                              num_computed_tokens=[c[2] for c in cached]),
        num_scheduled_tokens=scheduled or {}, finished_req_ids=set())


class RequestFailed(Exception):
    """vLLM's "fail" policy ended the request: a load it was promised failed."""


def vllm_config(socket, tp_size=1, block_size=4, extra=None, rank=0, policy="recompute", kv=None, role="kv_both"):
    """kv: the KV() layout of the workers (None: the numpy engine); "mla"
    makes the model an MLA one (vLLM's model_config.use_mla). role: vLLM's
    kv_role (kv_producer, kv_consumer, kv_both)."""
    ktc = SimpleNamespace(kv_connector="PegadConnector", kv_connector_module_path="pegad.vllm", kv_role=role,
                          is_kv_producer=role != "kv_consumer", kv_load_failure_policy=policy,
                          kv_connector_extra_config={"socket": socket, **(extra or {})})
    layout, dtype = (kv or {}).get("layout"), (kv or {}).get("dtype", "float32")
    mla = layout == "mla"
    mc = SimpleNamespace(model="tiny/numpy-decoder" if kv is None else f"tiny/torch-decoder-{layout}",
                         dtype=dtype, use_mla=mla,
                         get_total_num_hidden_layers=lambda: LAYERS, get_total_num_kv_heads=lambda: HEADS,
                         get_num_kv_heads=lambda pc: 1 if mla else HEADS // pc.tensor_parallel_size,
                         get_head_size=lambda: LATENT if mla else HEAD_DIM)
    return SimpleNamespace(kv_transfer_config=ktc, model_config=mc,
                           cache_config=SimpleNamespace(block_size=block_size, cache_dtype="auto"),
                           parallel_config=SimpleNamespace(tensor_parallel_size=tp_size, pipeline_parallel_size=1,
                                                           rank=rank))


# --- worker processes -------------------------------------------------------

def _worker(rank, tp, conn, peer, socket, num_blocks, block_size, extra, stubs, policy, kv_spec, role="kv_both"):
    sys.path[:0] = stubs
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        model = Model(tp_rank=rank, tp_size=tp)
        if kv_spec is None:
            kv = NumpyKV(num_blocks, block_size, model.heads)
        else:
            kv = KV(kv_spec["layout"], num_blocks, block_size, model.heads, kv_spec.get("dtype", "float32"),
                    kv_spec.get("device", "cpu"))
        c = None
        if socket is not None:
            from pegad.vllm import PegadConnector
            c = PegadConnector(vllm_config(socket, tp, block_size, extra, rank, policy, kv_spec, role),
                               KVConnectorRole.WORKER)
            c.register_kv_caches({f"layers.{i}.attn": kv.tensors[i] for i in range(LAYERS)})

        def allreduce(x):
            if peer is None:
                return x
            peer.send(x)
            return x + peer.recv()  # a + b == b + a exactly: every rank gets the same sum
        conn.send(("ready", None))
        while True:
            cmd, arg = conn.recv()
            if cmd == "stop":
                if c is not None:
                    c.shutdown()
                return
            if cmd == "finished":
                conn.send(("ok", c.get_finished(arg) if c else (None, None)))
                continue
            if cmd == "stats":
                if c is not None:
                    c.flush(30)
                conn.send(("ok", dict(c.stats) if c else {}))
                continue
            conn.send(("ok", _run_step(c, model, kv, block_size, allreduce, *arg)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def _run_step(c, model, kv, block_size, allreduce, meta, tokens, positions, table, sync, graphs):
    """One step of vLLM's runner (kv_connector_model_runner_mixin): tokens
    empty is kv_connector_no_forward. Returns (logits, load errors, ids
    whose asynchronous load finished)."""
    logits = None
    if c is None:
        if tokens:
            logits = model.forward(tokens, positions, kv, table, block_size, allreduce, _NoConnector())
        return logits, set(), set()
    c.bind_connector_metadata(meta)
    if sync:  # has_sync_kv_loads: the loads feed this forward
        c.start_load_kv(None)
    if tokens:
        hooks = _NoConnector() if graphs == "full" else c  # full CUDA graph replay skips the layer hooks
        logits = model.forward(tokens, positions, kv, table, block_size, allreduce, hooks)
    if not sync:
        c.start_load_kv(None)
    c.wait_for_save()
    _, recving = c.get_finished(set())
    errs = c.get_block_ids_with_load_errors()
    c.clear_connector_metadata()
    return logits, errs, set(recving or ())


class Engine:
    """One engine: the scheduler side here, tp worker processes. socket None:
    no connector (the full-recompute reference). policy: vLLM's
    kv_load_failure_policy; graphs: "piecewise" or "full" (no layer hooks);
    kv: the workers' torch KV() as {"layout", "dtype"} (None: numpy);
    role: vLLM's kv_role."""

    def __init__(self, socket, tp=1, num_blocks=64, block_size=4, extra=None, block_order=None, stubs=(),
                 policy="recompute", graphs="piecewise", kv=None, role="kv_both"):
        self.socket, self.tp, self.bs = socket, tp, block_size
        self.policy, self.graphs = policy, graphs
        self.free = list(block_order if block_order is not None else range(num_blocks))
        self.conn = None
        self.events = []  # what the driver saw: ("none",), ("loaded", n), ("load_errors", ids), ("async",)
        self.transfer_params = {}  # req_id -> the kv_transfer_params request_finished returned
        if socket is not None:
            from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
            from pegad.vllm import PegadConnector
            self.conn = PegadConnector(vllm_config(socket, tp, block_size, extra, 0, policy, kv, role),
                                       KVConnectorRole.SCHEDULER)
        ctx = mp.get_context("spawn")
        peers = ctx.Pipe() if tp == 2 else (None, None)
        self.pipes, self.procs = [], []
        for r in range(tp):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(r, tp, b, peers[r] if tp == 2 else None, socket, num_blocks,
                                                  block_size, extra, list(stubs), policy, kv, role), daemon=True)
            p.start()
            self.pipes.append(a)
            self.procs.append(p)
        self._all("ready")

    def _all(self, what=None, send=None):
        if send is not None:
            for p in self.pipes:
                p.send(send)
        out = []
        for p in self.pipes:
            if not p.poll(120):
                raise RuntimeError("worker did not answer in 120 s")
            st, v = p.recv()
            if st == "error":
                raise RuntimeError(f"worker failed:\n{v}")
            out.append(v)
        return out

    def close(self):
        for p in self.pipes:
            try:
                p.send(("stop", None))
            except OSError:
                pass
        for p in self.procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        if self.conn is not None:
            self.conn.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def worker_stats(self):
        return self._all(send=("stats", None))

    def _step(self, req, table, computed, n, meta, sync):
        toks = req.all_token_ids[computed:computed + n]
        res = self._all(send=("step", (meta, toks, list(range(computed, computed + n)), table, sync, self.graphs)))
        errs = set().union(*(e for _, e, _ in res))
        return res[0][0], errs, [r for _, _, r in res]

    def _on_errors(self, errs, table):
        """vLLM's kv_load_failure_policy: the first block to recompute, or
        RequestFailed under "fail"."""
        self.events.append(("load_errors", sorted(errs)))
        if self.policy == "fail":
            raise RequestFailed(f"blocks {sorted(errs)} failed to load")
        return min(table.index(b) for b in errs)

    def _lookup(self, req):
        for _ in range(600):
            ext, is_async = self.conn.get_num_new_matched_tokens(req, 0)
            if ext is not None:
                assert ext > 0 or is_async is False
                return ext, is_async
            self.events.append(("none",))
            time.sleep(0.05)
        raise AssertionError("get_num_new_matched_tokens answered None for 30 s")

    def _await_load(self, req, table):
        """WAITING_FOR_REMOTE_KVS: steps without a forward until every
        worker's get_finished named the request. The first block to
        recompute, or None when all loaded."""
        seen, errs = [False] * self.tp, set()
        for _ in range(3000):
            meta = self.conn.build_connector_meta(_sched_out())
            _, e, recv = self._step(req, table, 0, 0, meta, False)
            errs |= e
            seen = [s or req.request_id in r for s, r in zip(seen, recv)]
            if all(seen):
                return self._on_errors(errs, table) if errs else None
            time.sleep(0.01)
        raise AssertionError("the asynchronous load did not finish in 30 s")

    def serve(self, req_id, prompt, decode=2, between=None, after_alloc=None, kv_transfer_params=None):
        """Prefill prompt, then decode greedily. Returns (logits of every
        token computed by this engine keyed by position, tokens generated).
        between(engine) runs after the scheduler's lookup, before
        update_state_after_alloc; after_alloc(engine) after it, before the
        workers' step (to evict or stop the daemon there).
        kv_transfer_params: the request body's (P/D); what request_finished
        returns lands in transfer_params[req_id]."""
        bs = self.bs
        req = Request(req_id, list(prompt), bs)
        req.kv_transfer_params = dict(kv_transfer_params) if kv_transfer_params is not None else None
        ext, is_async = self._lookup(req) if self.conn is not None else (0, False)
        if between is not None:
            between(self)
        nblk = (req.num_tokens + bs - 1) // bs
        table = [self.free.pop(0) for _ in range(nblk)]
        if self.conn is not None:
            self.conn.update_state_after_alloc(req, KVCacheBlocks(table), ext)
        self.events.append(("loaded", ext // bs))
        if after_alloc is not None:
            after_alloc(self)
        computed = ext
        if is_async:
            self.events.append(("async",))
            first_bad = self._await_load(req, table)
            if first_bad is not None:
                computed = first_bad * bs
            self.conn.update_state_after_alloc(req, KVCacheBlocks(table), 0)
            if computed == req.num_tokens:  # vLLM's _update_waiting_for_remote_kv: the last token is computed again
                computed -= 1
        out = self._prefill(req, table, computed, sync=not is_async and ext > 0)
        gen = self._decode(req, table, out, decode)
        if self.conn is not None:
            delay, params = self.conn.request_finished(req, list(table))
            assert delay is False and (params is None or kv_transfer_params is not None)
            self.transfer_params[req_id] = params
            self._all(send=("finished", {req_id}))
        self.free.extend(table)
        return out, gen

    def _prefill(self, req, table, computed, sync):
        out, first, rid = {}, True, req.request_id
        while computed < req.num_tokens:
            n = req.num_tokens - computed
            meta = None
            if self.conn is not None:
                so = (_sched_out(new=[(rid, req.prompt_token_ids, list(table), computed)], scheduled={rid: n})
                      if first else _sched_out(cached=[(rid, None, computed)], scheduled={rid: n}))
                meta = self.conn.build_connector_meta(so)
            logits, errs, _ = self._step(req, table, computed, n, meta, sync and first)
            first = False
            if errs:  # the step's output is dropped
                computed = self._on_errors(errs, table) * self.bs
                continue
            for i in range(n):
                out[computed + i] = logits[i]
            computed += n
        return out

    def _decode(self, req, table, out, decode):
        gen, rid, computed = [], req.request_id, req.num_tokens
        for _ in range(decode):
            tok = int(np.argmax(out[req.num_tokens - 1]))
            gen.append(tok)
            req.all_token_ids.append(tok)
            req.rehash()
            new = None
            if (req.num_tokens + self.bs - 1) // self.bs > len(table):
                new = ([self.free.pop(0)],)
                table.extend(new[0])
            meta = None
            if self.conn is not None:
                meta = self.conn.build_connector_meta(_sched_out(cached=[(rid, new, computed)],
                                                                 scheduled={rid: 1}))
            logits, errs, _ = self._step(req, table, computed, 1, meta, False)
            assert not errs
            out[computed] = logits[0]
            computed += 1
        return gen
