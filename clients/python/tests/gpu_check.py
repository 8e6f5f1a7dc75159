"""make gpu-check's connector part (not a pytest module: make test never
runs it): on a CUDA device, through pegad.vllm and a real pegad
(PEGAD_BIN: a stripped build, no Go needed here):
- the pool is registered with CUDA (cudaPointerGetAttributes, through
  torch's is_pinned, on its address);
- a save and a load step run with torch.cuda.set_sync_debug_mode("error")
  (no synchronizing call on the forward thread), bytes checked;
- device->pool and pool->device GB/s against one cudaMemcpy of a
  contiguous pinned buffer of the same size (goal >= 0.8).
Exits non-zero on any failure; without CUDA it says so and exits 2."""

import os
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "stubs")]
import harness  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from pegad.vllm import BlockRun, PegadConnector, PegadConnectorMetadata  # noqa: E402
from tinyengine import vllm_config  # noqa: E402

LAYERS, NB, BS, H, D, N = 4, 1100, 16, 8, 128, 1000


def main():
    if not torch.cuda.is_available():
        print("gpu-check: no CUDA device (torch.cuda.is_available() is False): nothing checked")
        return 2
    d = harness.Daemon({"pegad": os.environ["PEGAD_BIN"]}, "gpu-check", pool_size="1GiB")
    try:
        cfg = vllm_config(d.socket, 1, BS, {"namespace": "gpu-check"})
        mc = cfg.model_config
        mc.get_num_kv_heads, mc.get_total_num_kv_heads, mc.get_head_size = lambda pc: H, lambda: H, lambda: D
        c = PegadConnector(cfg, KVConnectorRole.WORKER)
        caches = [torch.randn(2, NB, BS, H, D, device="cuda").half() for _ in range(LAYERS)]
        c.register_kv_caches({f"l{i}": t for i, t in enumerate(caches)})
        ids = torch.randperm(NB)[:N].tolist()
        hashes = [b"gpu-%d" % i for i in range(N)]
        nbytes = N * c.block_bytes
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        t0 = time.perf_counter()
        c.bind_connector_metadata(PegadConnectorMetadata(saves=[BlockRun("r", ids, hashes)]))
        c.wait_for_save()
        c.clear_connector_metadata()
        torch.cuda.set_sync_debug_mode(0)
        c.flush(120)
        save_s = time.perf_counter() - t0
        pool_t = c.worker.copier._pool[1]
        print(f"pool registered: is_pinned={pool_t.is_pinned()} at {pool_t.data_ptr():#x}")
        assert pool_t.is_pinned(), "the pool is not registered with CUDA"
        assert c.stats["saved_blocks"] == N, c.stats
        want = [t.clone() for t in caches]
        for t in caches:
            t.zero_()
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        t0 = time.perf_counter()
        c.bind_connector_metadata(PegadConnectorMetadata(loads=[BlockRun("r", ids, hashes)]))
        c.start_load_kv(None)
        c.clear_connector_metadata()
        torch.cuda.set_sync_debug_mode(0)
        c.flush(120)
        load_s = time.perf_counter() - t0
        assert c.get_finished(set())[1] == {"r"} and not c.get_block_ids_with_load_errors()
        for t, w in zip(caches, want):
            assert torch.equal(t[:, ids].view(torch.int16), w[:, ids].view(torch.int16)), "loaded bytes differ"
        pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        base = {}
        for name, (dst, src) in {"d2h": (pinned, dev), "h2d": (dev, pinned)}.items():
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dst.copy_(src, non_blocking=True)
            torch.cuda.synchronize()
            base[name] = nbytes / (time.perf_counter() - t0) / 1e9
        save, load = nbytes / save_s / 1e9, nbytes / load_s / 1e9
        print(f"device->pool {save:.1f} GB/s vs cudaMemcpy {base['d2h']:.1f}: {save / base['d2h']:.2f} (goal 0.8)")
        print(f"pool->device {load:.1f} GB/s vs cudaMemcpy {base['h2d']:.1f}: {load / base['h2d']:.2f} (goal 0.8)")
        print("(first-touch of each path included: one iteration)")
        c.shutdown()
    finally:
        d.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
