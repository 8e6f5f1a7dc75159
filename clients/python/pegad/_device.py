"""The device data path both engine connectors copy KV blocks through.

It owns how an engine's KV cache tensor (a torch tensor on the CPU or CUDA,
or a numpy array) is addressed, by shape and strides, never by assuming
C-contiguity; the one stored byte order of a block (docs/local-protocol.md
"Stored byte order"); and the copies between the cache and pegad's pool:
one gather (save) or scatter (load) per layer and run of back-to-back
blocks, on the CPU or on a CUDA stream of the connector's own. It must
never talk to the daemon, never reinterpret values (dtypes are bytes:
bf16, fp16 and fp8 are moved as same-sized integers) and never loop over
tokens in Python.

Layouts resolved (the logical shapes vLLM's attention backends hand a
connector; HND is the same logical shape with permuted strides):
- "kv_first"  (2, nb, bs, h, d)   FlashAttention NHD and HND
- "block_first" (nb, 2, bs, h, d) FlashInfer, Triton (NHD and HND)
- "packed"    (nb, h, bs, 2*d)    K and V in the last dimension (vLLM's
                                  CPU backend)
- "mla"       (nb, bs, d)         one latent per token
and any strided view of a larger tensor (all layers in one tensor).

Stored order of one block of one layer: K then V, each token-major
[bs, h, d] (MLA: the latent [bs, d]); a block is its layers one after
another.
"""

import threading
from dataclasses import dataclass

import numpy as np

__all__ = ["LayoutError", "Layer", "resolve", "Copier", "runs", "numa_node"]


class LayoutError(ValueError):
    """A KV cache tensor whose shape and strides pegad cannot serve."""


try:  # CUDA and fp8 are optional: a CPU-only or numpy-only engine needs neither
    import torch
except ImportError:  # pragma: no cover - torch is installed wherever tests run
    torch = None

_INT = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


@dataclass
class Layer:
    """One layer's cache as a view in the stored order: blocks[b] is block
    b's bytes laid out as stored ([2, bs, h, d], or [bs, d] for MLA), in a
    same-sized integer dtype."""
    name: str
    layout: str
    blocks: object  # torch.Tensor
    nbytes: int  # stored bytes of one block of this layer

    @property
    def is_cuda(self):
        return self.blocks.is_cuda


def _as_ints(t):
    """t (torch tensor or numpy array) as a torch tensor over the same
    memory in the same-sized integer dtype (bytes, not values)."""
    if torch is None:
        raise LayoutError("pegad's device path needs torch (python3-torch or pip install torch)")
    if isinstance(t, np.ndarray):
        if t.dtype.itemsize not in _INT:
            raise LayoutError(f"dtype {t.dtype} of {t.dtype.itemsize} bytes")
        t = torch.from_numpy(t.view(_INT[t.dtype.itemsize]))
    if not isinstance(t, torch.Tensor):
        raise LayoutError(f"a KV cache must be a torch tensor or numpy array, not {type(t).__name__}")
    es = t.element_size()
    if es not in _INT:
        raise LayoutError(f"dtype {t.dtype} of {es} bytes")
    want = getattr(torch, _INT[es])
    return t if t.dtype == want else t.view(want)  # same element size: any strides


def _fits(shape, want):
    return all(w is None or s == w for s, w in zip(shape, want))


def resolve(name, t, block_size, heads=None, head_size=None, num_blocks=None):
    """The Layer of one layer's cache t. block_size is required; heads
    (this rank's KV heads), head_size and num_blocks disambiguate where a
    shape alone could be read two ways. Raises LayoutError naming the
    shape and strides when no layout (or more than one) fits."""
    x = _as_ints(t)
    shape, es = tuple(x.shape), x.element_size()
    nb, bs, h, d = num_blocks, block_size, heads, head_size
    found = []
    if x.dim() == 5:
        if _fits(shape, (2, nb, bs, h, d)):
            found.append(("kv_first", x.permute(1, 0, 2, 3, 4)))
        if _fits(shape, (nb, 2, bs, h, d)):
            found.append(("block_first", x))
    elif x.dim() == 4 and shape[3] % 2 == 0 and _fits(shape, (nb, h, bs, None)) and \
            (d is None or shape[3] == 2 * d):
        n, hh, b, dd = shape[0], shape[1], shape[2], shape[3] // 2
        s0, s1, s2, s3 = x.stride()
        # [nb, h, bs, 2, d] split of the last dim, then to [nb, 2, bs, h, d]
        found.append(("packed", x.as_strided((n, 2, b, hh, dd), (s0, dd * s3, s2, s1, s3), x.storage_offset())))
    elif x.dim() == 3 and _fits(shape, (nb, bs, None)) and (d is None or shape[2] == d):
        found.append(("mla", x))
    # (2, 2, bs, h, d) fits both 5-dim forms: only num_blocks tells them apart
    if len(found) != 1:
        what = "no layout" if not found else "more than one layout (" + ", ".join(f for f, _ in found) + ")"
        raise LayoutError(f"layer {name}: {what} fits shape {shape} strides {tuple(x.stride())} "
                          f"(block_size {bs}, heads {h}, head_size {d}, num_blocks {nb}); pegad serves "
                          "(2, nb, bs, h, d), (nb, 2, bs, h, d), (nb, h, bs, 2*d) and (nb, bs, d), any strides")
    layout, blocks = found[0]
    if any(s < 0 for s in blocks.stride()):
        raise LayoutError(f"layer {name}: negative strides {tuple(x.stride())}")
    per = 1
    for s in blocks.shape[1:]:
        per *= s
    return Layer(name, layout, blocks, per * es)


def runs(block_ids, offsets, block_bytes):
    """Group blocks that lie back to back in the pool so each run costs one
    copy per layer: [(block ids in pool order, byte offset in the pool of
    the first, n)]. offsets are the blocks' byte offsets in the pool, in
    the order of block_ids. A run may also go down: a full pool evicts a
    chain from its last block back, so a batch saved into the room it
    frees gets each block just below the one before."""
    out = []
    i, n = 0, len(block_ids)
    while i < n:
        j = i + 1
        if j < n and offsets[j] == offsets[i] - block_bytes:
            while j < n and offsets[j] == offsets[j - 1] - block_bytes:
                j += 1
            out.append((block_ids[i:j][::-1], offsets[j - 1], j - i))
        else:
            while j < n and offsets[j] == offsets[j - 1] + block_bytes:
                j += 1
            out.append((block_ids[i:j], offsets[i], j - i))
        i = j
    return out


SYS_PCI = "/sys/bus/pci/devices"


def numa_node(device, sys_pci=SYS_PCI):
    """The NUMA node of a CUDA device (torch.device, or its index): its PCI
    address from torch, then sysfs's numa_node; None for the CPU, or where
    either is not known (a kernel without NUMA says -1). Copies from a GPU
    run fastest into pool memory on its node: the connectors ask the daemon
    for room there."""
    if device is None or torch is None:
        return None
    if not isinstance(device, int):
        device = torch.device(device)
        if device.type != "cuda":
            return None
        device = device.index if device.index is not None else torch.cuda.current_device()
    try:
        props = torch.cuda.get_device_properties(device)
        bus = getattr(props, "pci_bus_id", None)
        if bus is None:  # torch before 2.3 does not say
            return None
        addr = f"{getattr(props, 'pci_domain_id', 0):04x}:{bus:02x}:{getattr(props, 'pci_device_id', 0):02x}.0"
        return _sysfs_node(addr, sys_pci)
    except (RuntimeError, AssertionError, AttributeError, TypeError):  # no CUDA here after all
        return None


def _sysfs_node(pci_addr, sys_pci=SYS_PCI):
    """sysfs's NUMA node of the PCI device pci_addr ("0000:17:00.0"), None
    when it has none (-1) or cannot be read."""
    try:
        with open(f"{sys_pci}/{pci_addr.lower()}/numa_node") as f:
            node = int(f.read().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


class Copier:
    """Copies between one engine's layers and pegad's pool.

    CPU caches are copied by the calling thread (torch lets go of the GIL).
    CUDA caches go through a device staging buffer on the connector's own
    stream, one DMA per run from or to the pool, which is registered with
    CUDA (cudaHostRegister) once per mapping and unregistered at close.
    """

    def __init__(self, layers):
        self.layers = layers
        self.offsets = []
        off = 0
        for layer in layers:
            self.offsets.append(off)
            off += layer.nbytes
        self.block_bytes = off
        self.cuda = bool(layers) and layers[0].is_cuda
        if any(layer.is_cuda != self.cuda for layer in layers):
            raise LayoutError("layers on the CPU and on CUDA at once")
        self.device = layers[0].blocks.device if layers else None
        # Where saves ask the daemon for room (None: anywhere, a CPU cache).
        self.numa_node = numa_node(self.device) if self.cuda else None
        self._mu = threading.Lock()  # guards _pool (the save and load threads share it)
        self._pool = None  # (pool memoryview, uint8 tensor over it, registered address or None)
        self.stream = torch.cuda.Stream(device=self.device) if self.cuda else None

    def pool_tensor(self, pool):
        """The uint8 tensor over pool, made (and registered with CUDA) on
        the first use of this mapping; a new mapping (after a reconnect)
        replaces the old, which is unregistered."""
        with self._mu:
            cur = self._pool
            if cur is not None and cur[0] is pool:
                return cur[1]
            if cur is not None:
                self._unregister(cur)
            t = torch.frombuffer(pool, dtype=torch.uint8)
            reg = _register(t) if self.cuda else None
            self._pool = (pool, t, reg)
            return t

    @staticmethod
    def _unregister(cur):
        if cur[2] is not None:
            torch.cuda.cudart().cudaHostUnregister(cur[2])

    def close(self):
        with self._mu:
            if self._pool is not None:
                self._unregister(self._pool)
                self._pool = None

    def _views(self, pool_t, start, n, layer_i):
        """Layer layer_i of the n blocks at byte start of the pool, shaped
        like the layer's blocks."""
        layer = self.layers[layer_i]
        run = pool_t[start:start + n * self.block_bytes].view(n, self.block_bytes)
        off = self.offsets[layer_i]
        part = run[:, off:off + layer.nbytes].view(layer.blocks.dtype)
        return part.view(n, *layer.blocks.shape[1:])

    def save(self, pool_t, block_runs):
        """Gather each run's blocks, every layer, into the pool. CPU:
        done on return. CUDA: returns an event recorded on the connector's
        stream after the copies; the compute stream waits on it, so no
        later kernel overwrites the blocks first, and the host never waits."""
        if not self.cuda:
            for ids, start, n in block_runs:
                idx = torch.as_tensor(ids, dtype=torch.long)
                for li, layer in enumerate(self.layers):
                    torch.index_select(layer.blocks, 0, idx, out=self._views(pool_t, start, n, li))
            return None
        return self._save_cuda(pool_t, block_runs)

    def load(self, pool_t, block_runs):
        """Scatter each run from the pool into the layers' blocks. CPU:
        done on return. CUDA: returns the event that completes it."""
        if not self.cuda:
            for ids, start, n in block_runs:
                idx = torch.as_tensor(ids, dtype=torch.long)
                for li, layer in enumerate(self.layers):
                    layer.blocks[idx] = self._views(pool_t, start, n, li)
            return None
        return self._load_cuda(pool_t, block_runs)

    # CUDA: kept to these two functions so the CPU tests cover the rest.

    def _save_cuda(self, pool_t, block_runs):
        compute = torch.cuda.current_stream(self.device)
        s = self.stream
        s.wait_stream(compute)  # the forward's K/V writes come first
        with torch.cuda.stream(s):
            for ids, start, n in block_runs:
                idx = torch.as_tensor(ids, dtype=torch.long).to(self.device, non_blocking=True)
                stage = torch.empty(n * self.block_bytes, dtype=torch.uint8, device=self.device)
                for li, layer in enumerate(self.layers):
                    torch.index_select(layer.blocks, 0, idx, out=self._views(stage, 0, n, li))
                pool_t[start:start + n * self.block_bytes].copy_(stage, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(s)
        compute.wait_event(ev)  # later writes to these blocks wait for the copy, the host does not
        return ev

    def _load_cuda(self, pool_t, block_runs):
        s = self.stream
        with torch.cuda.stream(s):
            for ids, start, n in block_runs:
                idx = torch.as_tensor(ids, dtype=torch.long).to(self.device, non_blocking=True)
                stage = torch.empty(n * self.block_bytes, dtype=torch.uint8, device=self.device)
                stage.copy_(pool_t[start:start + n * self.block_bytes], non_blocking=True)
                for li, layer in enumerate(self.layers):
                    layer.blocks[idx] = self._views(stage, 0, n, li)
            ev = torch.cuda.Event()
            ev.record(s)
        return ev


def _register(t):
    """cudaHostRegister the pool tensor's memory so copies DMA straight
    into it; its address, or None when CUDA refused (copies then stage
    through pageable memory, slower but correct)."""
    ptr, size = t.data_ptr(), t.numel()
    rc = torch.cuda.cudart().cudaHostRegister(ptr, size, 0)
    if int(getattr(rc, "value", rc)) != 0:
        import logging
        logging.getLogger("pegad.device").warning("cudaHostRegister of the pool failed (%s): copies are slower", rc)
        return None
    return ptr
