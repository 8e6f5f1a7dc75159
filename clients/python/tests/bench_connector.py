"""pegad.vllm's worker side next to numpy copies of the same bytes, in one
run (scripts/bench.sh's connector rows).

    bench_connector.py [--benchtime 5x|1s] [--count 5]

- load: a 1,000-block prefix from pegad into the paged KV cache (a step
  whose start_load_kv hands the load to the load thread: lease, copy,
  release, until get_finished names it) vs torch scattering the same
  bytes, in the stored order, from one plain buffer into the same blocks.
- save: 1,000 blocks out of the paged KV cache into pegad (wait_for_save:
  alloc, copy; the commit) vs torch gathering the same bytes in the stored
  order into one plain buffer. (The -MB/s columns keep their numpy* names
  for scripts/bench.sh; the baseline is torch's index_select/index_put.)
- empty step: every worker call of a step with nothing to load or save vs
  the same calls on a connector that does nothing.

Shapes: 4 layers of [2, 1100 blocks, 16 tokens, 8 heads, 128] float16
(FlashAttention NHD, torch on the CPU), so a block is 256 KiB and 1,000
blocks 256 MiB. Each figure is the median iteration.
Prints go test's benchmark format.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

try:
    import vllm  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "stubs"))

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

from pegad.vllm import BlockRun, PegadConnector, PegadConnectorMetadata  # noqa: E402
from tinyengine import vllm_config  # noqa: E402

LAYERS, NUM_BLOCKS, BS, HEADS, DIM = 4, 1100, 16, 8, 128
N = 1000
POOL = 512 << 20


class _Noop(PegadConnector):
    """The baseline of the empty step: the same calls, doing nothing."""

    def start_load_kv(self, forward_context, **kwargs):
        pass

    def wait_for_layer_load(self, layer_name):
        pass

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        pass

    def wait_for_save(self):
        pass

    def get_block_ids_with_load_errors(self):
        return set()


def step(c, meta, names, caches):
    c.bind_connector_metadata(meta)
    c.start_load_kv(None)
    for name, cache in zip(names, caches):
        c.wait_for_layer_load(name)
        c.save_kv_layer(name, cache, None)
    c.wait_for_save()
    c.get_block_ids_with_load_errors()
    c.get_finished(set())
    c.clear_connector_metadata()


def run(socket, benchtime, seq):
    caches = [torch.from_numpy(np.random.default_rng(i).standard_normal((2, NUM_BLOCKS, BS, HEADS, DIM))
                               .astype(np.float16)) for i in range(LAYERS)]
    views = [t.view(torch.int16).permute(1, 0, 2, 3, 4) for t in caches]  # [nb, 2, bs, h, d]: the stored order
    names = [f"layers.{i}.attn" for i in range(LAYERS)]
    cfg = vllm_config(socket, 1, BS, {"namespace": "bench-connector"})
    mc = cfg.model_config  # the bench's shapes, not the tiny model's
    mc.get_num_kv_heads, mc.get_total_num_kv_heads, mc.get_head_size = lambda pc: HEADS, lambda: HEADS, lambda: DIM
    c = PegadConnector(cfg, KVConnectorRole.WORKER)
    c.register_kv_caches(dict(zip(names, caches)))
    noop = _Noop(cfg, KVConnectorRole.WORKER)
    noop.register_kv_caches(dict(zip(names, caches)))
    nbytes = N * c.block_bytes
    rng = np.random.default_rng(seq)
    flat = torch.empty((N, LAYERS, 2, BS, HEADS, DIM), dtype=torch.int16)  # torch's plain buffer, stored order
    t = {"load": [], "numpyload": [], "save": [], "numpysave": [], "step": [], "noop": []}
    clock = time.perf_counter
    empty = PegadConnectorMetadata()

    def iteration(i):
        ids = rng.permutation(NUM_BLOCKS)[:N]
        hashes = [b"bench-%d-%d-%d" % (seq, i, j) for j in range(N)]
        t0 = clock()
        step(c, PegadConnectorMetadata(saves=[BlockRun("r", list(ids), hashes)]), names, caches)
        c.flush(60)
        t1 = clock()
        idx = torch.as_tensor(ids)
        for layer in range(LAYERS):
            torch.index_select(views[layer], 0, idx, out=flat[:, layer])
        t2 = clock()
        ids2 = rng.permutation(NUM_BLOCKS)[:N]
        step(c, PegadConnectorMetadata(loads=[BlockRun("r", list(ids2), hashes)]), names, caches)
        c.flush(60)
        if c.get_finished(set())[1] != {"r"}:
            raise SystemExit("the load did not finish")
        t3 = clock()
        idx2 = torch.as_tensor(ids2)
        for layer in range(LAYERS):
            views[layer][idx2] = flat[:, layer]
        t4 = clock()
        steps = []
        for _ in range(200):
            s0 = clock()
            step(c, empty, names, caches)
            s1 = clock()
            step(noop, empty, names, caches)
            s2 = clock()
            steps.append((s1 - s0, s2 - s1))
        errs = c.stats["load_error_blocks"]
        if errs:
            raise SystemExit(f"{errs} blocks failed to load")
        return (t3 - t2, t4 - t3, t1 - t0, t2 - t1, statistics.median(s for s, _ in steps),
                statistics.median(n for _, n in steps))

    # Warm up until every page of the pool has been written once: the first
    # write to a page costs ~10x a later one (NOTES), a running daemon's
    # pool is warm.
    for i in range(POOL // nbytes + 2):
        iteration(-1 - i)
    n = 0
    start = clock()
    fixed = benchtime.endswith("x")
    limit = int(benchtime[:-1]) if fixed else float(benchtime.rstrip("s"))
    while (n < limit) if fixed else (clock() - start < limit):
        for k, v in zip(t, iteration(n)):
            t[k].append(v)
        n += 1
    wall = clock() - start
    med = {k: statistics.median(v) for k, v in t.items()}
    rate = {k: nbytes / med[k] / 1e6 for k in ("load", "numpyload", "save", "numpysave")}
    print(f"BenchmarkConnectorLoadSave1000\t{n}\t{wall / n * 1e9:.0f} ns/op"
          + "".join(f"\t{rate[k]:.2f} {k}-MB/s" for k in rate), flush=True)
    print(f"# ratios: load {rate['load'] / rate['numpyload']:.2f}, save {rate['save'] / rate['numpysave']:.2f} "
          f"of torch (target >= 0.9); empty step {med['step'] * 1e6:.1f} us (target <= 50)", flush=True)
    print(f"BenchmarkConnectorEmptyStep\t{n * 200}\t{med['step'] * 1e9:.0f} ns/op"
          f"\t{med['step'] * 1e9:.0f} step-ns/op\t{med['noop'] * 1e9:.0f} noop-ns/op", flush=True)
    c.shutdown()
    noop.shutdown()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--benchtime", default="5x")
    ap.add_argument("--count", type=int, default=1)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="pegad-py-bench-")
    daemon = None
    try:
        bins = harness.build(d)
        daemon = harness.Daemon(bins, "pybench-conn", pool_size=f"{POOL >> 20}MiB")
        for i in range(args.count):
            run(daemon.socket, args.benchtime, i)
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
