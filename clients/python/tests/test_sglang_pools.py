"""pegad.sglang against the host pools SGLang may register beyond one plain
MHA or MLA pool: CPU torch pools in bf16, fp16 and a uint8 (fp8) view, byte
by byte; the two fp8 formats apart; an MLA pool split for decode context
parallel refused; a HostPoolGroup served for its KV pool alone and refused
when it holds a hybrid model's other pools; tp_lcm_size said out loud."""

import logging
from types import SimpleNamespace

import numpy as np
import pytest

from test_sglang_engine import PAGE, HostPool, page_keys, storage
from test_sglang_layouts import LAYOUTS, indices, stored

torch = pytest.importorskip("torch")

TORCH = {"bf16": (np.int16, "bfloat16"), "fp16": (np.int16, "float16"), "u8": (np.uint8, "uint8")}


def torch_pool(layout, kind, mla=False, seed=0, **kw):
    """A host pool whose kv_buffer is a CPU torch tensor of kind, beside
    the numpy pool over the same memory (its expected_segment is the
    oracle). Random bits, so every byte of a page is checked."""
    np_dtype, torch_dtype = TORCH[kind]
    ref = HostPool(layout, mla=mla, dtype=np_dtype, **kw)
    ref.kv_buffer[...] = np.random.default_rng(seed).integers(
        0, 1 << (8 * ref.kv_buffer.itemsize), ref.kv_buffer.shape).astype(np_dtype)
    t = torch.from_numpy(ref.kv_buffer).view(getattr(torch, torch_dtype))
    return SimpleNamespace(layout=layout, page_size=PAGE, kv_buffer=t), ref


@pytest.mark.parametrize("kind", sorted(TORCH))
@pytest.mark.parametrize("layout", LAYOUTS)
def test_sglang_torch_pool_bytes(daemon, ns, layout, kind):
    """A CPU torch pool (SGLang's host pools are torch tensors) stores the
    module doc's bytes and reads them back into another torch pool."""
    pool, ref = torch_pool(layout, kind, seed=5)
    s, _ = storage(daemon.socket, layout, ns, pool=pool)
    ks = page_keys(list(range(300, 300 + 2 * PAGE)))
    assert s.batch_set_v1(ks, indices([12, 0])) == [True, True]
    for k, st in zip(ks, [12, 0]):
        assert stored(daemon.socket, s.namespace, k) == [ref.expected_segment(0, st), ref.expected_segment(1, st)]
    back, back_ref = torch_pool(layout, kind, seed=6)
    back_ref.kv_buffer[...] = 0
    b, _ = storage(daemon.socket, layout, ns, pool=back)
    assert b.batch_get_v1(ks, indices([28, 44])) == [True, True]
    for st, ot in zip([12, 0], [28, 44]):
        for kv in (0, 1):
            assert back_ref.expected_segment(kv, ot) == ref.expected_segment(kv, st)


@pytest.mark.parametrize("layout", ["page_first_direct", "layer_first"])
def test_sglang_torch_mla_pool_bytes(daemon, ns, layout):
    pool, ref = torch_pool(layout, "bf16", mla=True, seed=7, head_dim=24)
    s, _ = storage(daemon.socket, layout, None, pool=pool, is_mla_model=True, model_name="mla-torch-" + ns)
    ks = page_keys(list(range(400, 400 + PAGE)))
    assert s.batch_set_v1(ks, indices([20])) == [True]
    assert stored(daemon.socket, s.namespace, ks[0]) == [ref.expected_segment(0, 20)]


def test_sglang_fp8_formats_do_not_share_a_namespace(daemon, ns):
    """SGLang stores fp8 e4m3 and e5m2 caches alike as uint8: the device
    pool's dtype keeps them apart. Where the two dtypes agree (bf16), the
    namespace is the one a pool without a device pool gets, as before."""
    def namespace(kind, device_dtype):
        pool, _ = torch_pool("page_first", kind)
        if device_dtype is not None:
            pool.device_pool = SimpleNamespace(dtype=device_dtype)
        s, _ = storage(daemon.socket, "page_first", None, pool=pool, model_name="fp8-" + ns)
        s.close()
        return s.namespace
    assert namespace("u8", torch.float8_e4m3fn if hasattr(torch, "float8_e4m3fn") else "torch.float8_e4m3fn") != \
        namespace("u8", "torch.float8_e5m2")
    assert namespace("bf16", torch.bfloat16) == namespace("bf16", None)


def test_sglang_mla_dcp_pool_refused(daemon, ns):
    """Decode context parallel splits an MLA page's tokens over the ranks:
    storing the latent once would lose the others' slices."""
    pool = HostPool("page_first", mla=True)
    pool.dcp_size = 2
    with pytest.raises(ValueError, match="decode context parallel"):
        storage(daemon.socket, "page_first", ns, pool=pool, is_mla_model=True)


def _group(*entries):
    anchor = entries[0]
    return SimpleNamespace(entries=list(entries), anchor_entry=anchor, layout=anchor.host_pool.layout,
                           page_size=anchor.host_pool.page_size, kv_buffer=anchor.host_pool.kv_buffer)


def test_sglang_host_pool_group(daemon, ns):
    """A HostPoolGroup of the KV pool alone is served as that pool; one
    that also holds a hybrid model's state pool is refused at registration,
    not left to store KV pages without their state."""
    from sglang.srt.mem_cache.hicache_storage import PoolName
    kv = HostPool("page_first")
    plain, _ = storage(daemon.socket, "page_first", None, pool=kv, model_name="group-" + ns)
    grouped, _ = storage(daemon.socket, "page_first", None, model_name="group-" + ns,
                         pool=_group(SimpleNamespace(name=PoolName.KV, host_pool=kv)))
    assert grouped.mem_pool_host is kv and grouped.namespace == plain.namespace
    hybrid = _group(SimpleNamespace(name=PoolName.KV, host_pool=kv),
                    SimpleNamespace(name=PoolName.MAMBA, host_pool=HostPool("page_first")))
    with pytest.raises(ValueError, match="mamba"):
        storage(daemon.socket, "page_first", ns, pool=hybrid)


def test_sglang_split_heads_is_said(daemon, ns, caplog):
    """tp_lcm_size (page_head pages split by head for engines of other TP
    sizes) is not done: the backend says so at registration."""
    with caplog.at_level(logging.WARNING, logger="pegad.sglang"):
        storage(daemon.socket, "page_head", ns, should_split_heads=True, tp_lcm_size=4)
    assert any("tp_lcm_size" in r.getMessage() for r in caplog.records)
