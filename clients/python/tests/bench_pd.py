"""make pd-e2e's timing sweep: P/D through pegad.vllm's real handoff and
load path, next to a bare READ of the same bytes between the same daemons.

    bench_pd.py [--sizes 1,8,64,512] [--reps 3] [--bin-dir DIR]

Two pegad daemons on loopback (tcp transport, one cluster index: a
redis-server this script starts), a producer connector (kv_producer,
scheduler and worker in this process) on one and a consumer (kv_consumer)
on the other, each over a synthetic paged KV cache of Llama-3-8B's shape:
32 layers of [2, blocks, 16 tokens, 8 KV heads, 128] bf16 (FlashAttention
NHD, torch on the CPU), so a block is 2 MiB and 512 blocks are 1 GiB.

Per size and repetition, with a fresh prompt (new hashes), both just
saved by the producer, as a decode's pull always finds them:
- handoff-to-load: from the producer's request_finished (which takes the
  handoff) to the consumer's get_finished naming the request: the consumer
  scheduler's get_num_new_matched_tokens and update_state_after_alloc, the
  worker's pull (prefetch from the producer's pegad, known_peer_only, the
  handoff token), lease, copy into the KV cache and release. The loaded
  blocks are then compared with the producer's, byte for byte.
- bare READ: one plain Client.prefetch of the same blocks from the
  producer's pegad into the consumer's (no handoff, no copy into a cache),
  with the consumer's copy deleted first.
The two go first in turn (even repetitions the handoff, odd ones the bare
READ), so neither always reads the producer's blocks for the first time:
a first read of pool pages just written takes up to twice a second one on
these VMs. After each repetition both nodes delete the prompt's blocks, so
the next one is saved and fetched into pool pages used before, as a
long-running daemon's are (a page's first touch after start-up costs
several times a later one here: ../shared/NOTES.md, "Measuring"), and a
warm-up of the largest size touches every page the sweep uses before
anything is timed. (Before 2026-12-08 the bare READ always went second and
re-fetched blocks the consumer had deleted a moment before, into the very
pages the pull had just warmed, while the pull read new ones into pages
never used: that measured the VM's first touches, up to 8x at 8 blocks.)
One warm-up repetition of each is dropped; each figure is the median of
--reps (three times as many up to 64 blocks). Prints one line per size,
    pd-e2e: 64 blocks: handoff-to-load 12.3 ms, bare READ 11.0 ms, ratio 0.89
(ratio = bare READ / handoff-to-load, higher is better), then
"pd-e2e: PASS ..." or exits 1.
"""

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from types import SimpleNamespace

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import harness  # noqa: E402

try:
    import vllm  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(HERE, "stubs"))

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

import pegad  # noqa: E402
from pegad import keys  # noqa: E402
from pegad.vllm import PegadConnector  # noqa: E402
from test_cluster import _listening, free_port  # noqa: E402
from tinyengine import KVCacheBlocks, Request, _sched_out  # noqa: E402

LAYERS, BS, HEADS, DIM = 32, 16, 8, 128
BLOCK = LAYERS * 2 * BS * HEADS * DIM * 2  # 2 MiB


def config(socket, role, extra):
    ktc = SimpleNamespace(kv_connector="PegadConnector", kv_connector_module_path="pegad.vllm", kv_role=role,
                          is_kv_producer=role != "kv_consumer", kv_load_failure_policy="recompute",
                          kv_connector_extra_config={"socket": socket, **extra})
    mc = SimpleNamespace(model="synthetic/llama-3-8b-shape", dtype="bfloat16", use_mla=False,
                         get_total_num_hidden_layers=lambda: LAYERS, get_total_num_kv_heads=lambda: HEADS,
                         get_num_kv_heads=lambda pc: HEADS, get_head_size=lambda: DIM)
    return SimpleNamespace(kv_transfer_config=ktc, model_config=mc,
                           cache_config=SimpleNamespace(block_size=BS, cache_dtype="auto"),
                           parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1, rank=0))


class Side:
    """One engine's connector pair (scheduler and worker) over its cache."""

    def __init__(self, socket, role, num_blocks, extra, fill):
        cfg = config(socket, role, extra)
        self.sched = PegadConnector(cfg, KVConnectorRole.SCHEDULER)
        self.worker = PegadConnector(cfg, KVConnectorRole.WORKER)
        self.caches = []
        for _ in range(LAYERS):
            t = torch.zeros((2, num_blocks, BS, HEADS, DIM), dtype=torch.bfloat16)
            if fill:
                t.view(torch.int16).random_(-32768, 32767)
            self.caches.append(t)
        self.worker.register_kv_caches({f"layers.{i}": t for i, t in enumerate(self.caches)})

    def step(self, meta):
        """One worker step without a forward: loads started, saves taken;
        the request ids whose load finished and the failed block ids."""
        w = self.worker
        w.bind_connector_metadata(meta)
        w.start_load_kv(None)
        w.wait_for_save()
        _, recving = w.get_finished(set())
        errs = w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()
        return set(recving or ()), errs

    def close(self):
        self.worker.shutdown()
        self.sched.shutdown()


def produce(p, rid, n):
    """The producer's prefill of n full blocks (and one token more): saved,
    committed. Returns the request and its block table."""
    tokens = [random.randrange(128000) for _ in range(n * BS + 1)]
    req = Request(rid, tokens, BS)
    req.kv_transfer_params = {"do_remote_decode": True, "do_remote_prefill": False}
    table = list(range(n + 1))
    p.sched.get_num_new_matched_tokens(req, 0)
    p.sched.update_state_after_alloc(req, KVCacheBlocks(table), 0)
    meta = p.sched.build_connector_meta(_sched_out(new=[(rid, tokens, table, 0)], scheduled={rid: len(tokens)}))
    p.step(meta)
    return req, table


def consume(c, rid, tokens, params, n):
    """The consumer's side of one request: scheduler calls, then worker
    steps until get_finished names it. Returns (block table, errors)."""
    req = Request(rid, tokens, BS)
    req.kv_transfer_params = params
    ext, is_async = c.sched.get_num_new_matched_tokens(req, 0)
    if ext != n * BS or not is_async:
        raise AssertionError(f"consumer asked to load {ext} tokens (async {is_async}), want {n * BS}")
    table = list(range(n, -1, -1))
    c.sched.update_state_after_alloc(req, KVCacheBlocks(table), ext)
    meta = c.sched.build_connector_meta(_sched_out())
    errs = set()
    deadline = time.monotonic() + 120
    while True:
        done, e = c.step(meta)
        errs |= e
        if rid in done:
            break
        if time.monotonic() > deadline:
            raise AssertionError(f"{rid}: the load did not finish in 120 s")
        meta = c.sched.build_connector_meta(_sched_out())
        time.sleep(0.0005)
    c.sched.update_state_after_alloc(req, KVCacheBlocks(table), 0)
    c.sched.request_finished(req, table)
    return table, errs


def same_blocks(p, ptable, c, ctable, n):
    for pl, cl in zip(p.caches, c.caches):
        src = pl[:, ptable[:n]]
        dst = cl[:, ctable[:n]]
        if not torch.equal(src.view(torch.int16), dst.view(torch.int16)):
            return False
    return True


def one_size(p, c, pnode, cnode, n, reps, ns):
    """Medians of reps pairs (handoff-to-load ms, bare READ ms) of n blocks,
    after one warm-up pair; the two alternate which goes first."""
    handoff_ms, bare_ms = [], []
    with pegad.Client(cnode.socket, timeout=120) as cc, pegad.Client(pnode.socket, timeout=120) as pc:
        for rep in range(reps + 1):
            rid = f"pd-{n}-{rep}"
            req, ptable = produce(p, rid, n)
            hashes = [keys.hash_bytes(h) for h in req.block_hashes[:n]]
            bare_first = rep % 2 == 1
            if bare_first:
                bare = bare_read(cc, ns, hashes, pnode, rid)
            pulled = c.worker.stats["pd_pulled_blocks"]
            h = handoff_to_load(p, c, req, ptable, rid, n)
            if c.worker.stats["pd_pulled_blocks"] - pulled != n:  # none found local: all read
                raise AssertionError(f"{rid}: the consumer pulled {c.worker.stats['pd_pulled_blocks'] - pulled} "
                                     f"blocks, want {n}")
            if not bare_first:
                bare = bare_read(cc, ns, hashes, pnode, rid)
            forget(cc, ns, hashes)  # the next prompt reuses these pages on both nodes
            forget(pc, ns, hashes)
            if rep > 0:  # the first is the warm-up
                handoff_ms.append(h)
                bare_ms.append(bare)
    return statistics.median(handoff_ms), statistics.median(bare_ms)


def handoff_to_load(p, c, req, ptable, rid, n):
    """ms from the producer's request_finished to the consumer's load done,
    the loaded blocks checked against the producer's."""
    t0 = time.perf_counter()
    _, params = p.sched.request_finished(req, ptable)
    if params is None:
        raise AssertionError(f"{rid}: the producer handed nothing off")
    params = json.loads(json.dumps(params))  # as the proxy carries it
    ctable, errs = consume(c, rid, req.prompt_token_ids, params, n)
    t1 = time.perf_counter()
    if errs:
        raise AssertionError(f"{rid}: load errors for blocks {sorted(errs)}")
    if not same_blocks(p, ptable, c, ctable, n):
        raise AssertionError(f"{rid}: the consumer's blocks differ from the producer's")
    return (t1 - t0) * 1e3


def forget(client, ns, hashes):
    """Delete whichever of hashes client's node holds."""
    for h in hashes:
        try:
            client.delete(ns, h)
        except pegad.errors.NotFound:
            pass


def bare_read(cc, ns, hashes, pnode, rid):
    """ms of one plain prefetch of hashes from the producer's pegad into the
    consumer's (whose copy, if any, is deleted first, and after: the pull
    must fetch them again)."""
    forget(cc, ns, hashes)
    t2 = time.perf_counter()
    res = cc.prefetch(ns, hashes, peer=pnode.listen, timeout=120)
    t3 = time.perf_counter()
    if sum(1 for b in res.blocks if b.status == "fetched") != len(hashes):
        raise AssertionError(f"{rid}: bare READ fetched {res.blocks}")
    forget(cc, ns, hashes)
    return (t3 - t2) * 1e3


class Redis:
    def __init__(self):
        exe = shutil.which("redis-server")
        if exe is None:
            raise SystemExit("pd-e2e: redis-server not installed (Debian package redis-server)")
        self.dir = tempfile.mkdtemp(prefix="pd-e2e-redis-")
        self.port = free_port()
        self.proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", self.dir],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        harness.wait_until("redis to listen", lambda: _listening(self.port), timeout=10)
        self.url = f"redis://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1,8,64,512")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--bin-dir", default=os.environ.get("PEGAD_BIN_DIR"))
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    random.seed(34)
    bins = {"pegad": os.path.join(args.bin_dir, "pegad"), "pegactl": os.path.join(args.bin_dir, "pegactl")}
    pool = f"{(max(sizes) * BLOCK * 5 // 4 + (256 << 20)) >> 20}MiB"  # the largest prompt, a quarter more, staging
    redis = Redis()
    pnode = cnode = p = c = None
    try:
        pnode = harness.Daemon(bins, "pd-e2e-prefill", pool_size=pool, extra=("--cluster-redis", redis.url))
        cnode = harness.Daemon(bins, "pd-e2e-decode", pool_size=pool, extra=("--cluster-redis", redis.url))
        harness.wait_until("the producer in the cluster index", lambda: pnode.listen in cnode.ctl(
            "-o", "json", "nodes", "list", check=False).stdout.decode(), timeout=30)
        extra = {"namespace": "pd-e2e", "pull_timeout": 120.0, "timeout": 120.0}
        p = Side(pnode.socket, "kv_producer", max(sizes) + 2, extra, fill=True)
        c = Side(cnode.socket, "kv_consumer", max(sizes) + 2, extra, fill=False)
        ns = keys.rank_namespace("pd-e2e", 0)
        # Every pool page the sweep will use, and the caches, touched once
        # before anything is timed (first-fit: a smaller prompt reuses the
        # low end of what the largest one used).
        one_size(p, c, pnode, cnode, max(sizes), 1, ns)
        worst = None
        for n in sizes:
            # Small sizes cost milliseconds: more repetitions steady their medians on a busy machine.
            h, b = one_size(p, c, pnode, cnode, n, args.reps * (3 if n <= 64 else 1), ns)
            ratio = b / h
            print(f"pd-e2e: {n} blocks: handoff-to-load {h:.1f} ms, bare READ {b:.1f} ms, ratio {ratio:.2f}",
                  flush=True)
            if n >= 8:
                worst = ratio if worst is None else min(worst, ratio)
        stats = c.worker.stats
        print(f"pd-e2e: PASS {len(sizes)} sizes, medians of {args.reps}+ reps, every load byte-equal to the producer's, "
              f"{stats['pd_pulled_blocks']} blocks pulled, lowest ratio at >= 8 blocks "
              f"{worst if worst is None else f'{worst:.2f}'} (issue 34 asks >= 0.8); bare READ and handoff "
              f"alternate first, pool pages reused and warmed; pull in parts of "
              f"{c.worker.worker.pull_chunk_bytes >> 20} MiB (0: one prefetch)", flush=True)
    finally:
        for side in (c, p):
            if side is not None:
                side.close()
        for d in (cnode, pnode):
            if d is not None:
                d.stop()
        redis.stop()


if __name__ == "__main__":
    main()
