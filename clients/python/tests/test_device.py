"""pegad._device: every layout vLLM hands a connector resolves by shape and
strides, and saves into / loads from pool bytes byte-exact in the one stored
order (per layer K then V, token-major [bs, h, d]; MLA the latent), in
bf16, fp16 and a uint8 (fp8) view. The expected bytes are built by indexing
each layout (tinyengine.KV.logical), not from strides.

PEGAD_DEVICE=cuda runs the same on a GPU (make gpu-check)."""

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from pegad import _device  # noqa: E402
from tinyengine import LAYERS, LAYOUTS, KV  # noqa: E402

DEVICE = os.environ.get("PEGAD_DEVICE", "cpu")
NB, BS, H, D = 12, 4, 2, 8
DTYPES = ["bfloat16", "float16", "uint8"] + (["float8_e4m3fn"] if hasattr(torch, "float8_e4m3fn") else [])


def _random_bytes(kv, seed):
    g = torch.Generator().manual_seed(seed)
    for t in kv.tensors:
        ints = t.view(torch.uint8 if t.element_size() == 1 else torch.int16)
        lo, hi = (0, 256) if ints.dtype == torch.uint8 else (-32768, 32768)
        ints.copy_(torch.randint(lo, hi, ints.shape, generator=g, dtype=ints.dtype))


def _kv(layout, dtype, seed=1):
    kv = KV(layout, NB, BS, H, dtype, DEVICE, head_dim=D)
    _random_bytes(kv, seed)
    return kv


def _bytes(t):
    t = t.contiguous().cpu()
    return t.view(torch.uint8 if t.element_size() == 1 else torch.int16).numpy().tobytes()


def _copier(kv):
    layers = [_device.resolve(f"l{i}", t, BS, None if kv.mla else H, D, NB) for i, t in enumerate(kv.tensors)]
    return _device.Copier(layers), layers


def _pool_runs(copier, ids, gaps):
    """A pool (bytearray) and runs of ids laid out with a gap after the
    blocks in gaps (so runs break there)."""
    bb = copier.block_bytes
    pool = memoryview(bytearray(bb * (len(ids) + len(gaps) + 1)))
    bufs, offs, off = [], [], 0
    for i, _ in enumerate(ids):
        bufs.append(pool[off:off + bb])
        offs.append(off)
        off += bb * (2 if i in gaps else 1)
    return pool, bufs, offs, _device.runs(ids, offs, bb)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_save_and_load_are_byte_exact(layout, dtype):
    kv = _kv(layout, dtype)
    copier, layers = _copier(kv)
    assert layers[0].layout == LAYOUTS[layout][2]
    ids = [7, 2, 11, 0, 5]
    pool, bufs, offs, runs = _pool_runs(copier, ids, gaps={1})
    assert len(runs) == 2
    pool_t = copier.pool_tensor(pool)
    ev = copier.save(pool_t, runs)
    if ev is not None:
        ev.synchronize()
    for j, b in enumerate(ids):
        want = b"".join(_bytes(kv.logical(li)[b]) for li in range(LAYERS))
        assert bytes(bufs[j]) == want, f"block {b} stored out of order"
    other = _kv(layout, dtype, seed=2)  # another engine's cache, other bytes in every block
    before = [kv2.clone() for kv2 in (other.logical(li) for li in range(LAYERS))]
    c2, _ = _copier(other)
    ev = c2.load(c2.pool_tensor(pool), _device.runs(ids, offs, c2.block_bytes))
    if ev is not None:
        ev.synchronize()
    for li in range(LAYERS):
        got, src = other.logical(li), kv.logical(li)
        for b in range(NB):
            assert _bytes(got[b]) == _bytes(src[b] if b in ids else before[li][b]), (li, b)
    copier.close()
    c2.close()


def test_numpy_arrays_resolve_like_tensors():
    a = np.random.default_rng(0).standard_normal((2, NB, BS, H, D)).astype(np.float16)
    hnd = np.ascontiguousarray(a.transpose(0, 1, 3, 2, 4)).transpose(0, 1, 3, 2, 4)  # HND strides
    for arr in (a, hnd):
        (layer,) = [_device.resolve("l", arr, BS, H, D)]
        assert layer.layout == "kv_first" and layer.nbytes == 2 * BS * H * D * 2
        assert _bytes(layer.blocks[3]) == np.stack([a[0, 3], a[1, 3]]).view(np.int16).tobytes()


@pytest.mark.parametrize("shape,kw,match", [
    ((2, 2, BS, H, D), {"num_blocks": 2}, "more than one layout"),  # 2 blocks: K/V first or block first
    ((NB, 3, BS, H, D), {}, "no layout"),
    ((NB, H, BS, 2 * D + 1), {}, "no layout"),
    ((NB, BS * 2, D), {}, "no layout"),
    ((2, NB, BS, H, D), {"heads": H + 1}, "no layout"),
])
def test_unservable_shapes_are_refused_by_name(shape, kw, match):
    with pytest.raises(_device.LayoutError, match=match) as e:
        _device.resolve("layers.3.attn", torch.zeros(shape, dtype=torch.float16), BS, **kw)
    assert isinstance(e.value, ValueError) and "layers.3.attn" in str(e.value) and "strides" in str(e.value)


def test_a_new_pool_mapping_replaces_the_old():
    """After a reconnect the client maps a new pool: the copier's tensor
    follows it (and on CUDA registers it again)."""
    copier, _ = _copier(_kv("nhd", "float16"))
    a, b = memoryview(bytearray(1 << 16)), memoryview(bytearray(1 << 16))
    ta = copier.pool_tensor(a)
    assert copier.pool_tensor(a) is ta
    tb = copier.pool_tensor(b)
    assert tb is not ta and tb.data_ptr() == np.frombuffer(b, np.uint8).ctypes.data


def test_blocks_laid_out_downwards_are_one_run():
    """A full pool evicts a chain from its last block back, so a batch saved
    after it gets each block just below the one before: that is one run
    (one copy per layer), not one per block, and still byte-exact."""
    kv = _kv("nhd", "float16")
    copier, _ = _copier(kv)
    bb = copier.block_bytes
    ids = [7, 2, 11, 0, 5, 9]
    offs = [0, bb, 5 * bb, 4 * bb, 3 * bb, 2 * bb]  # up for 2 blocks, then down for 4
    runs = _device.runs(ids, offs, bb)
    assert runs == [([7, 2], 0, 2), ([9, 5, 0, 11], 2 * bb, 4)]
    pool = memoryview(bytearray(6 * bb))
    ev = copier.save(copier.pool_tensor(pool), runs)
    if ev is not None:
        ev.synchronize()
    for b, off in zip(ids, offs):
        want = b"".join(_bytes(kv.logical(li)[b]) for li in range(LAYERS))
        assert bytes(pool[off:off + bb]) == want, f"block {b} misplaced"
    copier.close()


# --- the GPU's NUMA node (where saves ask the daemon for room) -------------

def _fake_sysfs(tmp_path, addr, text):
    d = tmp_path / addr
    d.mkdir(parents=True)
    (d / "numa_node").write_text(text)
    return str(tmp_path)


@pytest.mark.parametrize("text,want", [("1\n", 1), ("0\n", 0), ("-1\n", None), ("junk\n", None)])
def test_sysfs_numa_node(tmp_path, text, want):
    sys_pci = _fake_sysfs(tmp_path, "0000:17:00.0", text)
    assert _device._sysfs_node("0000:17:00.0", sys_pci) == want
    assert _device._sysfs_node("0000:18:00.0", sys_pci) is None  # no such device


def test_numa_node_of_a_cuda_device_reads_its_pci_address(tmp_path, monkeypatch):
    """torch's PCI ids of the device name its sysfs entry (CUDA faked: these
    machines have none)."""
    torch = pytest.importorskip("torch")
    sys_pci = _fake_sysfs(tmp_path, "0001:b3:00.0", "1\n")
    props = type("P", (), {"pci_domain_id": 1, "pci_bus_id": 0xb3, "pci_device_id": 0})()
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: asked.append(d) or props)
    assert _device.numa_node(torch.device("cuda", 2), sys_pci) == 1 and asked == [2]
    assert _device.numa_node(3, sys_pci) == 1 and asked == [2, 3]
    old = type("P", (), {})()  # a torch that does not say the PCI address
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: old)
    assert _device.numa_node(0, sys_pci) is None


def test_numa_node_of_the_cpu_is_none():
    torch = pytest.importorskip("torch")
    assert _device.numa_node(None) is None and _device.numa_node(torch.device("cpu")) is None
    layer = _device.resolve("l0", torch.zeros(2, 4, 4, 2, 8, dtype=torch.float16), block_size=4)
    assert _device.Copier([layer]).numa_node is None  # a CPU cache: saves ask for no node
