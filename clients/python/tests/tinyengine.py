"""A real, tiny inference engine on the CPU for the connector tests.

A decoder-only transformer in numpy (random weights from a fixed seed) with a
paged KV cache in vLLM's layout, [2, num_blocks, block_size, heads, head_dim]
per layer, vLLM's chained block hashes (sha256 over pickle, as vLLM's
"sha256" prefix_caching_hash_algo), and a driver that calls a
KVConnectorBase_V1 in vLLM's order:

    scheduler: get_num_new_matched_tokens (again while it answers None),
               update_state_after_alloc, build_connector_meta
    workers:   bind_connector_metadata, start_load_kv, per layer
               wait_for_layer_load / attention / save_kv_layer,
               wait_for_save, get_block_ids_with_load_errors, get_finished,
               clear_connector_metadata
    scheduler: request_finished; workers: get_finished({req_id})

A failed load rolls the request back to its first failed block and
recomputes, as vLLM's "recompute" load-failure policy does. Each tensor-
parallel rank is its own worker process holding its share of the heads; the
attention output is summed over ranks through pipes (the all-reduce).
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

VOCAB, D_MODEL, LAYERS, HEADS, HEAD_DIM, FFN = 97, 32, 2, 4, 8, 64
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
                ("w1", (D_MODEL, FFN)), ("w2", (FFN, D_MODEL)))}
            for k in ("q", "k", "v"):
                w[k] = np.ascontiguousarray(w[k][:, hs])
            w["o"] = np.ascontiguousarray(w["o"][hs, :])
            self.layers.append(w)
        self.head = rng.standard_normal((D_MODEL, VOCAB)).astype(np.float32) * s

    def forward(self, tokens, positions, kv, block_table, block_size, allreduce, hooks):
        """Logits of tokens at positions (one request), writing their K/V
        into the paged cache kv (per layer [2, nb, bs, h, d]) and attending
        over the cache through block_table."""
        x = self.embed[tokens] + self.pos[positions]
        n = len(tokens)
        end = positions[-1] + 1
        slots = [(block_table[p // block_size], p % block_size) for p in positions]
        for li, w in enumerate(self.layers):
            name = f"layers.{li}.attn"
            hooks.wait_for_layer_load(name)
            h = _norm(x)
            q = (h @ w["q"]).reshape(n, self.heads, HEAD_DIM)
            k = (h @ w["k"]).reshape(n, self.heads, HEAD_DIM)
            v = (h @ w["v"]).reshape(n, self.heads, HEAD_DIM)
            for i, (b, o) in enumerate(slots):
                kv[li][0, b, o] = k[i]
                kv[li][1, b, o] = v[i]
            hooks.save_kv_layer(name, kv[li], None)
            nb = (end + block_size - 1) // block_size
            keys = kv[li][0, block_table[:nb]].reshape(-1, self.heads, HEAD_DIM)[:end]
            vals = kv[li][1, block_table[:nb]].reshape(-1, self.heads, HEAD_DIM)[:end]
            att = np.einsum("nhd,thd->hnt", q, keys) / np.sqrt(HEAD_DIM)
            mask = np.arange(end)[None, :] > np.asarray(positions)[:, None]
            att = np.where(mask[None], -1e30, att)
            att = np.exp(att - att.max(-1, keepdims=True))
            att /= att.sum(-1, keepdims=True)
            out = np.einsum("hnt,thd->nhd", att, vals).reshape(n, -1) @ w["o"]
            x = x + allreduce(out)
            x = x + np.maximum(_norm(x) @ w["w1"], 0) @ w["w2"]
        return _norm(x) @ self.head


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


def vllm_config(socket, tp_size=1, block_size=4, extra=None, rank=0):
    ktc = SimpleNamespace(kv_connector="PegadConnector", kv_connector_module_path="pegad.vllm", kv_role="kv_both",
                          is_kv_producer=True, kv_connector_extra_config={"socket": socket, **(extra or {})})
    mc = SimpleNamespace(model="tiny/numpy-decoder", dtype="float32",
                         get_total_num_hidden_layers=lambda: LAYERS, get_total_num_kv_heads=lambda: HEADS,
                         get_head_size=lambda: HEAD_DIM)
    return SimpleNamespace(kv_transfer_config=ktc, model_config=mc,
                           cache_config=SimpleNamespace(block_size=block_size, cache_dtype="auto"),
                           parallel_config=SimpleNamespace(tensor_parallel_size=tp_size, pipeline_parallel_size=1,
                                                           rank=rank))


# --- worker processes -------------------------------------------------------

def _worker(rank, tp, conn, peer, socket, num_blocks, block_size, extra, stubs):
    sys.path[:0] = stubs
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
        model = Model(tp_rank=rank, tp_size=tp)
        kv = [np.zeros((2, num_blocks, block_size, model.heads, HEAD_DIM), np.float32) for _ in range(LAYERS)]
        c = None
        if socket is not None:
            from pegad.vllm import PegadConnector
            c = PegadConnector(vllm_config(socket, tp, block_size, extra, rank), KVConnectorRole.WORKER)
            c.register_kv_caches({f"layers.{i}.attn": kv[i] for i in range(LAYERS)})

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
            meta, tokens, positions, table = arg
            hooks = c or _NoConnector()
            if c is not None:
                c.bind_connector_metadata(meta)
                c.start_load_kv(None)
            logits = model.forward(tokens, positions, kv, table, block_size, allreduce, hooks)
            errs = set()
            if c is not None:
                c.wait_for_save()
                errs = c.get_block_ids_with_load_errors()
                c.get_finished(set())
                c.clear_connector_metadata()
            conn.send(("ok", (logits if rank == 0 else None, errs)))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


class Engine:
    """One engine: the scheduler side here, tp worker processes. socket None:
    no connector (the full-recompute reference)."""

    def __init__(self, socket, tp=1, num_blocks=64, block_size=4, extra=None, block_order=None, stubs=()):
        self.socket, self.tp, self.bs = socket, tp, block_size
        self.free = list(block_order if block_order is not None else range(num_blocks))
        self.conn = None
        self.events = []  # what the driver saw: ("none",), ("loaded", n), ("load_errors", ids)
        if socket is not None:
            from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
            from pegad.vllm import PegadConnector
            self.conn = PegadConnector(vllm_config(socket, tp, block_size, extra), KVConnectorRole.SCHEDULER)
        ctx = mp.get_context("spawn")
        peers = ctx.Pipe() if tp == 2 else (None, None)
        self.pipes, self.procs = [], []
        for r in range(tp):
            a, b = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(r, tp, b, peers[r] if tp == 2 else None, socket, num_blocks,
                                                  block_size, extra, list(stubs)), daemon=True)
            p.start()
            self.pipes.append(a)
            self.procs.append(p)
        for _ in self.pipes:
            pass
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

    def _step(self, req, table, computed, n, meta):
        toks = req.all_token_ids[computed:computed + n]
        res = self._all(send=("step", (meta, toks, list(range(computed, computed + n)), table)))
        errs = set().union(*(e for _, e in res))
        return res[0][0], errs

    def serve(self, req_id, prompt, decode=2, between=None, after_alloc=None):
        """Prefill prompt, then decode greedily. Returns (logits of every
        token computed by this engine keyed by position, tokens generated).
        between(engine) runs after the scheduler's lookup, before
        update_state_after_alloc; after_alloc(engine) after it, before the
        workers' step (to evict or stop the daemon there)."""
        bs = self.bs
        req = Request(req_id, list(prompt), bs)
        ext = 0
        if self.conn is not None:
            for _ in range(600):
                ext, is_async = self.conn.get_num_new_matched_tokens(req, 0)
                assert is_async is False
                if ext is not None:
                    break
                self.events.append(("none",))
                time.sleep(0.05)
            else:
                raise AssertionError("get_num_new_matched_tokens answered None for 30 s")
        if between is not None:
            between(self)
        nblk = (req.num_tokens + bs - 1) // bs
        table = [self.free.pop(0) for _ in range(nblk)]
        if self.conn is not None:
            self.conn.update_state_after_alloc(req, KVCacheBlocks(table), ext)
        self.events.append(("loaded", ext // bs))
        if after_alloc is not None:
            after_alloc(self)
        out = {}
        computed = ext
        first = True
        while computed < req.num_tokens:
            n = req.num_tokens - computed
            meta = None
            if self.conn is not None:
                so = (_sched_out(new=[(req_id, prompt, list(table), computed)], scheduled={req_id: n}) if first else
                      _sched_out(cached=[(req_id, None, computed)], scheduled={req_id: n}))
                meta = self.conn.build_connector_meta(so)
            first = False
            logits, errs = self._step(req, table, computed, n, meta)
            if errs:  # vLLM's recompute policy: back to the first failed block, the step's output dropped
                self.events.append(("load_errors", sorted(errs)))
                computed = min(table.index(b) for b in errs) * bs
                continue
            for i in range(n):
                out[computed + i] = logits[i]
            computed += n
        gen = []
        for _ in range(decode):
            tok = int(np.argmax(out[req.num_tokens - 1]))
            gen.append(tok)
            req.all_token_ids.append(tok)
            req.rehash()
            new = None
            if (req.num_tokens + bs - 1) // bs > len(table):
                new = ([self.free.pop(0)],)
                table.extend(new[0])
            meta = None
            if self.conn is not None:
                meta = self.conn.build_connector_meta(_sched_out(cached=[(req_id, new, computed)],
                                                                 scheduled={req_id: 1}))
            logits, errs = self._step(req, table, computed, 1, meta)
            assert not errs
            out[computed] = logits[0]
            computed += 1
        if self.conn is not None:
            assert self.conn.request_finished(req, list(table)) == (False, None)
            self._all(send=("finished", {req_id}))
        self.free.extend(table)
        return out, gen
