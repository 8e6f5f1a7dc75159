"""Put and get of 4 MiB blocks from Python next to a numpy copy of the same
bytes in the same process (scripts/bench.sh's Python rows).

    bench_putget.py [--benchtime 1s|100x] [--count 5]

Prints one line per run in go test's benchmark format, so bench.sh's table
parses it: put-MB/s and get-MB/s beside numpyin-MB/s (copy the source array
into another) and numpyout-MB/s (copy that one into a third), both between
arrays the loop keeps in cache, and numpycold-MB/s: the source copied into
one of COLD_BUFS arrays in turn, more than the L3 holds, so the destination
is not in cache, as a put's room in the pool is not. Each iteration puts a
new block, gets it back into a numpy array, deletes it (untimed), then
times the numpy copies. Rates are of the median
iteration of each step: on a shared machine a preempted iteration says
nothing about the client, and the median drops it.
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402

import pegad  # noqa: E402

SIZE = 4 << 20
COLD_BUFS = 32  # 128 MiB of destinations: several times a server's L3


def run(c, benchtime):
    body = np.frombuffer(os.urandom(SIZE), dtype=np.uint8)
    dst, cp, cp2 = (np.empty(SIZE, dtype=np.uint8) for _ in range(3))
    cold = [np.ones(SIZE, dtype=np.uint8) for _ in range(COLD_BUFS)]  # ones: pages faulted in now, not timed
    t = {"put": [], "get": [], "numpyin": [], "numpyout": [], "numpycold": []}
    clock = time.perf_counter

    def iteration(i):
        h = b"%016x" % i
        t0 = clock()
        c.put("bench", h, body)
        t1 = clock()
        n = c.get("bench", h, dst)
        t2 = clock()
        assert n == SIZE
        c.delete("bench", h)
        t3 = clock()
        np.copyto(cp, body)
        t4 = clock()
        np.copyto(cp2, cp)
        t5 = clock()
        np.copyto(cold[i % COLD_BUFS], body)
        t6 = clock()
        return t1 - t0, t2 - t1, t4 - t3, t5 - t4, t6 - t5

    for i in range(8):  # warm up: first touch of the pool's pages in this process
        iteration(-1 - i)
    if not (dst == body).all():
        raise SystemExit("get returned different bytes")
    n = 0
    start = clock()
    fixed = benchtime.endswith("x")
    limit = int(benchtime[:-1]) if fixed else float(benchtime.rstrip("s"))
    while (n < limit) if fixed else (clock() - start < limit):
        for k, v in zip(t, iteration(n)):
            t[k].append(v)
        n += 1
    wall = clock() - start
    rate = {k: SIZE / statistics.median(v) / 1e6 for k, v in t.items()}
    print(f"BenchmarkPythonPutGetVsNumpy\t{n}\t{wall / n * 1e9:.0f} ns/op"
          + "".join(f"\t{rate[k]:.2f} {k}-MB/s" for k in t), flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--benchtime", default="1s")
    ap.add_argument("--count", type=int, default=1)
    args = ap.parse_args()
    d = tempfile.mkdtemp(prefix="pegad-py-bench-")
    daemon = None
    try:
        daemon = harness.Daemon(harness.build(d), "pybench")
        with pegad.Client(daemon.socket) as c:
            for _ in range(args.count):
                run(c, args.benchtime)
    finally:
        if daemon is not None:
            daemon.stop()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
