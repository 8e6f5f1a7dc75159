"""The cluster index lags puts (docs/cluster.md, "Index lag"), and the idiom
prefetch(ns, hashes[hit.local:hit.n], peer=hit.peer) must hold when nothing
is missing (issue 33, item 9)."""

import time

import pytest

import pegad
from conftest import rand_hash
from harness import Daemon
from test_cluster import redis_url  # noqa: F401 (the fixture)
from test_vllm_engine import BS, _req, prompts
from tinyengine import Engine, Request, block_hashes

from pegad import keys


@pytest.fixture
def pair(bins, redis_url):  # noqa: F811
    a = Daemon(bins, "py-lag-a", extra=("--cluster-redis", redis_url))
    b = Daemon(bins, "py-lag-b", extra=("--cluster-redis", redis_url))
    try:
        yield a, b
    finally:
        b.stop()
        a.stop()


@pytest.mark.parametrize("peer", [True, False], ids=["peer", "cluster-index"])
def test_empty_prefetch_is_a_no_op(daemon, ns, peer):
    with pegad.Client(daemon.socket) as c:
        hashes = [rand_hash()]
        c.put(ns, hashes[0], b"x" * 100)
        hit = pegad.ClusterHit(daemon.listen, 1, 1)  # everything is here already
        res = c.prefetch(ns, hashes[hit.local:hit.n], peer=hit.peer if peer else None)
        assert res.blocks == [] and res.bytes == 0
        assert c.prefetch_async(ns, [], peer=daemon.listen).result(30).blocks == []


def test_lookup_cluster_waits_for_the_index(pair, ns):
    """Right after a put on A, B's lookup_cluster with a wait finds A's
    prefix in one call; a wait of 0 is one round trip."""
    a, b = pair
    hashes = [rand_hash() for _ in range(4)]
    with pegad.Client(a.socket) as ca, pegad.Client(b.socket) as cb:
        cb.lookup_cluster(ns, hashes)  # warm: connections up before the clock starts
        for i, h in enumerate(hashes):
            ca.put(ns, h, bytes([i + 1]) * 4096)
        hit = cb.lookup_cluster(ns, hashes, wait=10)
        assert (hit.n, hit.local, hit.peer_id) == (4, 0, "py-lag-a")
        t0 = time.monotonic()
        missing = cb.lookup_cluster(ns, [rand_hash()], wait=0.2)
        assert missing.n == 0 and missing.peer is None and time.monotonic() - t0 >= 0.2
        with pytest.raises(pegad.InvalidArgument):
            cb.lookup_cluster(ns, hashes, wait=-1)
        res = cb.prefetch(ns, hashes[hit.local:hit.n], peer=hit.peer, timeout=20)
        assert res.bytes == 4 * 4096
        hit = cb.lookup_cluster(ns, hashes)
        assert hit.local == 4
        assert cb.prefetch(ns, hashes[hit.local:hit.n], peer=hit.peer).blocks == []  # nothing missing


def test_vllm_scheduler_waits_for_the_index(pair, ns):
    """B's scheduler asks right after A's blocks are put (inside the index's
    lag, some 20 ms): with cluster_wait it answers None while it waits off
    the scheduler thread, then has B prefetch them and answers the prefix.
    Before cluster_wait, that ask was a miss (0 tokens)."""
    a, b = pair
    prompt, longer = prompts(41)
    hashes = block_hashes(prompt, BS)
    rank_ns = keys.rank_namespace(ns, 0)
    extra = {"namespace": ns, "cluster": True, "cluster_wait": 10}
    with Engine(b.socket, block_size=BS, extra=extra) as eb, pegad.Client(a.socket) as ca:
        sched = eb.conn
        sched.get_num_new_matched_tokens(Request("warm", [1] * (BS + 1), BS), 0)  # B's client dialled
        for i, h in enumerate(hashes):  # the scheduler only looks: any bytes do
            ca.put(rank_ns, h, bytes([i + 1]) * 4096)
        req = _req(longer)
        first = got = sched.get_num_new_matched_tokens(req, 0)
        deadline = time.monotonic() + 30
        while got[0] is None and time.monotonic() < deadline:
            time.sleep(0.02)
            got = sched.get_num_new_matched_tokens(req, 0)
        assert first == (None, False) and got == (5 * BS, True), (first, got)  # an asynchronous load
    with pegad.Client(b.socket) as cb:
        assert cb.lookup(rank_ns, hashes) == 5
