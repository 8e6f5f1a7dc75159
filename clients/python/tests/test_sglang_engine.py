"""pegad.sglang in a real engine loop: engine A computes a prompt with the
tiny numpy decoder, backs its full pages up from the host pool with
batch_set_v1 under SGLang's chained page keys; engine B (another backend,
another host pool, other slots) serves prompt plus suffix: batch_exists,
batch_get_v1 into its host pool, host -> device, and computes only the
suffix. B's logits equal a full recompute's, in every host layout; with K
and V swapped in the stored pages they do not. Then each layout's stored
bytes, interface_v1, the Ascend layout, MLA (stored once), attention context
parallel and the v2 pool calls."""

import hashlib
from types import SimpleNamespace

import numpy as np
import pytest

import pegad
from harness import Daemon
from test_vllm_engine import TOL, prompts
from tinyengine import HEAD_DIM, HEADS, LAYERS, Model, _NoConnector

PAGE = 4


def page_keys(tokens):
    """SGLang's page keys: each the sha256 hex of the previous key and the
    page's token ids (hicache's get_hash_str chaining)."""
    out, prior = [], None
    for i in range(len(tokens) // PAGE):
        h = hashlib.sha256()
        if prior is not None:
            h.update(bytes.fromhex(prior))
        for t in tokens[i * PAGE:(i + 1) * PAGE]:
            h.update(t.to_bytes(4, "little", signed=False))
        prior = h.hexdigest()
        out.append(prior)
    return out


class HostPool:
    """MHATokenToKVPoolHost's (mla: MLATokenToKVPoolHost's) buffer and
    attributes, in numpy (pool_host/mha.py, mla.py init_kv_buffer)."""

    def __init__(self, layout, size=64, mla=False, dtype=np.float32, layers=LAYERS, heads=HEADS,
                 head_dim=HEAD_DIM):
        self.layout, self.page_size, self.size, self.mla = layout, PAGE, size, mla
        L, H, D, pages = layers, 1 if mla else heads, head_dim, size // PAGE
        shape = {"layer_first": (L, size, H, D), "page_first": (size, L, H, D),
                 "page_first_direct": (pages, L, PAGE, H, D), "page_head": (pages, H, PAGE, L, D)}[layout]
        self.kv_buffer = np.zeros(shape if mla else (2,) + shape, dtype)
        self.layers = L

    def page(self, kv, layer, start):
        """One layer of the page at token slot start: [PAGE, H, D] (a view)."""
        b = self.kv_buffer if self.mla else self.kv_buffer[kv]
        if self.layout == "layer_first":
            return b[layer, start:start + PAGE]
        if self.layout == "page_first":
            return b[start:start + PAGE, layer]
        if self.layout == "page_first_direct":
            return b[start // PAGE, layer]
        return b[start // PAGE, :, :, layer].transpose(1, 0, 2)  # page_head [H, P, D]

    def backup(self, dev, blocks, starts):  # device -> host
        for b, s in zip(blocks, starts):
            for li in range(LAYERS):
                for kv in (0, 1):
                    self.page(kv, li, s)[...] = dev[li][kv, b]

    def load(self, dev, blocks, starts):  # host -> device
        for b, s in zip(blocks, starts):
            for li in range(LAYERS):
                for kv in (0, 1):
                    dev[li][kv, b] = self.page(kv, li, s)

    def expected_segment(self, kv, start):
        """The bytes pegad.sglang's module doc says a page's K (V, latent)
        segment holds, built layer by layer from page()."""
        per_layer = np.stack([self.page(kv, li, start) for li in range(self.layers)])  # [L, P, H, D]
        order = {"page_first": (1, 0, 2, 3), "layer_first": (0, 1, 2, 3), "page_first_direct": (0, 1, 2, 3),
                 "page_head": (2, 1, 0, 3)}[self.layout]
        return np.ascontiguousarray(per_layer.transpose(order)).tobytes()


def config(socket, ns=None, interface_v1=True, **over):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    extra = {"backend_name": "pegad", "module_path": "pegad.sglang", "class_name": "PegadStorage",
             "socket": socket}
    if ns is not None:
        extra["namespace"] = ns
    if interface_v1:
        extra["interface_v1"] = 1
    kw = dict(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
              enable_storage_metrics=False, is_page_first_layout=True, model_name="tiny/numpy-decoder",
              extra_config=extra)
    kw.update(over)
    return HiCacheStorageConfig(**kw)


def storage(socket, layout, ns, pool=None, **over):
    from pegad.sglang import PegadStorage
    s = PegadStorage(config(socket, ns, is_page_first_layout=layout != "layer_first", **over), {})
    pool = pool if pool is not None else HostPool(layout)
    s.register_mem_pool_host(pool)
    return s, pool


def forward(model, tokens, start, dev, table):
    return model.forward(tokens[start:], list(range(start, len(tokens))), dev, table, PAGE, lambda x: x,
                         _NoConnector())


def new_cache():
    return [np.zeros((2, 32, PAGE, HEADS, HEAD_DIM), np.float32) for _ in range(LAYERS)]


def run(socket, layout, ns, swap=False):
    prompt, longer = prompts(21)
    model = Model()
    # Engine A: compute the prompt, back its full pages up.
    a, pool_a = storage(socket, layout, ns)
    dev_a, table_a = new_cache(), list(range(8))
    forward(model, prompt, 0, dev_a, table_a)
    ka = page_keys(prompt)
    starts_a = [8 + i * PAGE for i in range(len(ka))]
    pool_a.backup(dev_a, table_a[:len(ka)], starts_a)
    if swap:
        pool_a.kv_buffer[[0, 1]] = pool_a.kv_buffer[[1, 0]]
    host_a = np.array([s + j for s in starts_a for j in range(PAGE)])
    assert a.batch_set_v1(ka, host_a) == [True] * len(ka)
    # Engine B: other pool slots, other device blocks.
    b, pool_b = storage(socket, layout, ns)
    kb = page_keys(longer)
    n = b.batch_exists(kb[:(len(longer) - 1) // PAGE])
    assert n == len(ka)
    starts_b = [40 - i * PAGE for i in range(n)]
    host_b = np.array([s + j for s in starts_b for j in range(PAGE)])
    assert b.batch_get_v1(kb[:n], host_b) == [True] * n
    dev_b, table_b = new_cache(), list(range(31, 23, -1))
    pool_b.load(dev_b, table_b[:n], starts_b)
    got = forward(model, longer, n * PAGE, dev_b, table_b)
    want = forward(model, longer, 0, new_cache(), list(range(8)))[n * PAGE:]
    a.close()
    b.close()
    return float(np.abs(got - want).max())


ALL_LAYOUTS = ["page_first", "layer_first", "page_first_direct", "page_head"]


@pytest.mark.parametrize("layout", ALL_LAYOUTS)
def test_sglang_backend_prefix_matches_full_recompute(daemon, ns, layout):
    assert run(daemon.socket, layout, ns) < TOL


@pytest.mark.parametrize("layout", ALL_LAYOUTS)
def test_sglang_negative_control_swapped_k_and_v(daemon, ns, layout):
    assert run(daemon.socket, layout, ns, swap=True) > 100 * TOL


def test_sglang_backend_without_pegad_reports_nothing(bins, ns):
    """pegad stopped: nothing exists, gets and sets say False, no raise."""
    d = Daemon(bins, "py-sglang-stop")
    s, _ = storage(d.socket, "page_first", ns)
    d.stop()
    keys_ = page_keys(list(range(8)))
    assert s.batch_exists(keys_) == 0
    assert s.batch_get_v1(keys_, np.arange(8)) == [False, False]
    assert s.batch_set_v1(keys_, np.arange(8)) == [False, False]
    assert s.get(keys_[0]) is None and s.exists(keys_[0]) is False


def test_sglang_copying_calls(daemon, ns):
    """The generic calls keep their own namespace: a block stored through
    them is never a batch_exists hit that batch_get_v1 cannot read."""
    s, _ = storage(daemon.socket, "page_first", ns)
    k = page_keys(list(range(4)))[0]
    assert not s.exists(k)
    assert s.set(k, np.arange(16, dtype=np.float32))
    assert s.exists(k) and s.batch_exists([k, "00" * 32]) == 0
    assert s.batch_get_v1([k], np.arange(PAGE)) == [False]
    out = np.zeros(16, np.float32)
    s.get(k, out)
    assert (out == np.arange(16)).all()
    with pegad.Client(daemon.socket) as c:
        assert c.delete(s.namespace + ".flat", bytes.fromhex(k)) is False
