"""prefetch without a peer: the daemon asks the cluster index (Redis) which
node holds each block; per-block results name that node."""

import shutil
import socket
import subprocess
import tempfile

import pytest

import pegad
from conftest import rand_hash
from harness import Daemon, wait_until


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture(scope="module")
def redis_url():
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server not installed (Debian package redis-server)")
    d = tempfile.mkdtemp(prefix="pegad-py-redis-")
    for _ in range(5):  # a free port can be taken between probe and bind
        port = free_port()
        p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                              "--dir", d], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            wait_until("redis to listen", lambda: p.poll() is not None or _listening(port), timeout=10)
        except AssertionError:
            pass
        if p.poll() is None and _listening(port):
            break
        p.kill()
        p.wait()
    else:
        pytest.fail("redis-server did not start")
    try:
        yield f"redis://127.0.0.1:{port}"
    finally:
        p.terminate()
        p.wait(10)
        shutil.rmtree(d, ignore_errors=True)


def _listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_prefetch_from_the_cluster_index(bins, redis_url, ns):
    holder = Daemon(bins, "py-holder", extra=("--cluster-redis", redis_url))
    requester = Daemon(bins, "py-requester", extra=("--cluster-redis", redis_url))
    try:
        hashes = [rand_hash() for _ in range(3)]
        with pegad.Client(holder.socket) as hc:
            for i, h in enumerate(hashes):
                hc.put(ns, h, bytes([i + 1]) * 50000)
        unknown = rand_hash()
        with pegad.Client(requester.socket, timeout=60) as c:
            nodes = {}  # hash -> node that served it (a block fetched by an earlier try is already_local later)

            def fetched():
                res = c.prefetch(ns, hashes + [unknown], timeout=20)
                got = {b.hash: b for b in res.blocks}
                nodes.update((h, b.node) for h, b in got.items() if b.status == "fetched")
                return got if all(got[h].status in ("fetched", "already_local") for h in hashes) else None

            got = wait_until("the holder's blocks in the index", fetched, timeout=30)
            assert got[unknown].status == "not_found"
            assert {nodes.get(h) for h in hashes} == {"py-holder"}
            for i, h in enumerate(hashes):
                out = bytearray(50000)
                assert c.get(ns, h, out) == 50000 and out == bytes([i + 1]) * 50000
    finally:
        requester.stop()
        holder.stop()


def test_lookup_cluster_then_prefetch_async(bins, redis_url, ns):
    """B finds A's longer prefix through the index (lookup_cluster), fetches
    the tail it lacks with prefetch_async, then holds the whole prefix."""
    a = Daemon(bins, "py-lk-a", extra=("--cluster-redis", redis_url))
    b = Daemon(bins, "py-lk-b", extra=("--cluster-redis", redis_url))
    try:
        hashes = [rand_hash() for _ in range(6)]
        with pegad.Client(a.socket) as ca:
            for i, h in enumerate(hashes[:5]):
                ca.put(ns, h, bytes([i + 1]) * 4096)
        with pegad.Client(b.socket, timeout=60) as cb:
            cb.put(ns, hashes[0], bytes([1]) * 4096)
            hit = wait_until("A's prefix in the index",
                             lambda: (lambda h: h if h.n == 5 else None)(cb.lookup_cluster(ns, hashes)), timeout=30)
            assert hit.local == 1 and hit.peer_id == "py-lk-a" and hit.peer
            fut = cb.prefetch_async(ns, hashes[hit.local:hit.n], peer=hit.peer, timeout=20)
            res = fut.result(timeout=60)
            assert fut.done() and res.bytes == 4 * 4096
            assert cb.lookup(ns, hashes) == 5
    finally:
        b.stop()
        a.stop()
