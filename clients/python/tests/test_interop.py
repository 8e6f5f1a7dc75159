"""Blocks put from Python read back byte-identical through pegactl and the Go
client, and the other way round, against a real pegad."""

import os
import subprocess

import numpy as np
import pytest

import pegad
from conftest import rand_hash


def go(bins, *args):
    return subprocess.run([bins["goclient"], *args], capture_output=True, check=True, text=True).stdout.strip()


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "numpy-f16", "numpy-2d"])
def test_python_put_pegactl_get(client, daemon, ns, tmp_path, kind):
    raw = os.urandom(3 << 20)
    data = {
        "bytes": raw,
        "bytearray": bytearray(raw),
        "memoryview": memoryview(raw),
        "numpy-f16": np.frombuffer(raw, dtype=np.float16),
        "numpy-2d": np.frombuffer(raw, dtype=np.uint8).reshape(3, 1 << 20),
    }[kind]
    h = rand_hash()
    assert client.put(ns, h, data) is True
    assert client.put(ns, h, data) is False  # stored already: kept
    out = tmp_path / "out"
    daemon.ctl("blocks", "get", "--namespace", ns, "--hash", h.hex(), "--out", str(out))
    assert out.read_bytes() == raw


def test_pegactl_put_python_get_and_lease(client, daemon, ns, tmp_path):
    k, v = os.urandom(1 << 20), os.urandom(4097)
    (tmp_path / "k").write_bytes(k)
    (tmp_path / "v").write_bytes(v)
    h = rand_hash()
    daemon.ctl("blocks", "put", "--namespace", ns, "--hash", h.hex(), "--kv",
               "--file", str(tmp_path / "k"), "--file", str(tmp_path / "v"))
    out = bytearray(len(k) + len(v) + 100)
    assert client.get(ns, h, out) == len(k) + len(v)
    assert out[:len(k) + len(v)] == k + v
    with client.lease(ns, h) as r:
        assert r.size == len(k) + len(v)
        assert len(r.slots) == 1
        assert r.slots[0].k == k and r.slots[0].v == v
        assert r.buffer == k + v
        assert r.buffer.readonly


def test_python_put_go_client_get_with_slots(client, bins, daemon, ns, tmp_path):
    slots = [pegad.SlotSize(4096, 4096), pegad.SlotSize(8192, 0), (1000, 24)]
    raw = os.urandom(sum(k + v for k, v in slots))
    h = rand_hash()
    assert client.put(ns, h, raw, slots=slots)
    out = tmp_path / "go.out"
    layout = go(bins, "get", daemon.socket, ns, h.hex(), str(out))
    assert layout == "4096:4096 8192:0 1000:24"
    assert out.read_bytes() == raw


def test_go_client_put_python_lease_with_slots(client, bins, daemon, ns, tmp_path):
    raw = os.urandom(3 * (1 << 16) + 3 * 512)
    (tmp_path / "in").write_bytes(raw)
    h = rand_hash()
    go(bins, "put", daemon.socket, ns, h.hex(), str(tmp_path / "in"), "65536:512", "65536:512", "65536:512")
    with client.lease(ns, h) as r:
        assert [(len(s.k), len(s.v)) for s in r.slots] == [(65536, 512)] * 3
        assert b"".join(bytes(seg) for seg in r.segments()) == raw
        # numpy over the pool without a copy: the array's memory is the lease's
        arr = np.frombuffer(r.buffer, dtype=np.uint8)
        assert arr.tobytes() == raw
        assert not arr.flags.writeable
        del arr
    out = np.zeros(len(raw), dtype=np.uint8)
    assert client.get(ns, h, out) == len(raw)
    assert out.tobytes() == raw


def test_alloc_in_place_is_what_others_read(client, daemon, ns, tmp_path):
    h = rand_hash()
    with client.alloc(ns, h, 1 << 20, slots=[(1 << 19, 1 << 19)]) as w:
        a = np.frombuffer(w.buffer, dtype=np.float16)
        a[:] = np.arange(a.size, dtype=np.float16)
        expect = a.tobytes()
        del a
    assert w.created
    with pytest.raises(ValueError):
        w.buffer[0] = 1  # released at commit: the room is no longer this writer's
    out = tmp_path / "out"
    daemon.ctl("blocks", "get", "--namespace", ns, "--hash", h.hex(), "--out", str(out))
    assert out.read_bytes() == expect
    # A second client's lease sees the same bytes in its own mapping.
    with pegad.Client(daemon.socket) as c2, c2.lease(ns, h) as r:
        assert r.buffer == expect


def test_alloc_aborts_on_exception(client, daemon, ns):
    h = rand_hash()
    before = daemon.stats()["pool_used"]
    with pytest.raises(RuntimeError):
        with client.alloc(ns, h, 65536) as w:
            w.buffer[:4] = b"half"
            assert daemon.stats()["pool_used"] == before + 65536
            raise RuntimeError("engine failed mid-write")
    assert daemon.stats()["pool_used"] == before
    with pytest.raises(pegad.NotFound):
        client.lease(ns, h)
    assert daemon.ctl("blocks", "get", "--namespace", ns, "--hash", h.hex(), "--out", os.devnull,
                      check=False).returncode != 0


def test_alloc_of_stored_key_raises_exists(client, ns):
    h = rand_hash()
    client.put(ns, h, b"x" * 100)
    with pytest.raises(pegad.Exists):
        client.alloc(ns, h, 100)


def test_lease_pins_until_release(client, daemon, ns):
    h = rand_hash()
    client.put(ns, h, b"pinned" * 1000)
    r = client.lease(ns, h)
    assert daemon.stats()["pinned_blocks"] >= 1
    assert client.delete(ns, h) is True  # deferred: pinned
    assert r.buffer == b"pinned" * 1000  # still the block's memory until release
    r.release()
    r.release()  # no-op
    with pytest.raises(ValueError):
        bytes(r.buffer)  # released view
    with pytest.raises(pegad.NotFound):
        client.lease(ns, h)


def test_batch_forms(client, daemon, ns):
    blocks = [(rand_hash(), os.urandom(4096 + i)) for i in range(50)]
    assert client.put_batch(ns, blocks) == [True] * 50
    assert client.put_batch(ns, blocks[:2]) == [False, False]
    missing = rand_hash()
    outs = [bytearray(8192) for _ in range(51)]
    res = client.get_batch(ns, [h for h, _ in blocks] + [missing], outs)
    assert res[:50] == [len(d) for _, d in blocks]
    assert isinstance(res[50], pegad.NotFound)
    for (_, d), o in zip(blocks, outs):
        assert o[:len(d)] == d

    rs = client.lease_batch(ns, [h for h, _ in blocks[:10]] + [missing])
    assert isinstance(rs[10], pegad.NotFound)
    assert [bytes(r.buffer) for r in rs[:10]] == [d for _, d in blocks[:10]]
    assert daemon.stats()["pinned_blocks"] >= 10
    client.release_batch(rs[:10])

    hs = [rand_hash() for _ in range(5)]
    ws = client.alloc_batch([pegad.AllocRequest(ns, h, 128) for h in hs] + [(ns, blocks[0][0], 5)])
    assert isinstance(ws[5], pegad.Exists)
    for i, w in enumerate(ws[:5]):
        w.buffer[:] = bytes([i]) * 128
    client.commit_batch(ws[:4])
    client.abort_batch(ws[4:5])
    assert [w.created for w in ws[:4]] == [True] * 4
    got = client.get_batch(ns, hs, [bytearray(128) for _ in hs])
    assert got[:4] == [128] * 4 and isinstance(got[4], pegad.NotFound)


def test_delete(client, ns):
    h = rand_hash()
    client.put(ns, h, b"gone")
    assert client.delete(ns, h) is False
    with pytest.raises(pegad.NotFound):
        client.delete(ns, h)
    with pytest.raises(pegad.NotFound):
        client.get(ns, h, bytearray(10))


def test_prefetch_per_block_results(bins, daemon, ns):
    peer = __import__("harness").Daemon(bins, "pytest-peer")
    try:
        held = [rand_hash() for _ in range(3)]
        with pegad.Client(peer.socket) as pc:
            for i, h in enumerate(held):
                pc.put(ns, h, bytes([i]) * 70000)
        local = rand_hash()
        missing = rand_hash()
        with pegad.Client(daemon.socket, timeout=60) as c:
            c.put(ns, local, b"here")
            res = c.prefetch(ns, held + [local, missing], peer=peer.listen, timeout=30)
            status = {b.hash: b.status for b in res.blocks}
            # Lower-case, as pegactl prints them (str.__eq__: no alias involved).
            assert [str.__eq__(status[h], "fetched") for h in held] == [True] * 3
            assert str.__eq__(status[local], "already_local")
            assert str.__eq__(status[missing], "missing_on_peer")
            # The upper-case names of 0.1.0 still compare equal.
            assert status[local] == "ALREADY_LOCAL" and status[missing] != "FETCHED"
            assert res.bytes >= 3 * 70000
            for i, h in enumerate(held):
                out = bytearray(70000)
                assert c.get(ns, h, out) == 70000 and out == bytes([i]) * 70000
            with pytest.raises(pegad.FailedPrecondition):
                c.prefetch(ns, held)  # no peer: this daemon has no cluster index (--cluster-redis)
    finally:
        peer.stop()


def test_data_path_never_loads_grpc(daemon, ns):
    # put, get, alloc and lease go over the data socket only: grpc and the
    # generated protobuf messages are not even imported.
    code = f"""
import sys, pegad
with pegad.Client({daemon.socket!r}) as c:
    c.put({ns!r}, b"nogrpc", b"x" * 4096)
    c.get({ns!r}, b"nogrpc", bytearray(4096))
    with c.lease({ns!r}, b"nogrpc") as r: pass
    with c.alloc({ns!r}, b"nogrpc2", 10) as w: w.buffer[:] = b"0123456789"
bad = [m for m in sys.modules if m == "grpc" or m.startswith("google.protobuf") or m.startswith("pegad.v1")]
print(bad)
"""
    out = subprocess.run([os.environ.get("PEGAD_PYTHON", __import__("sys").executable), "-c", code],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_pool_address_for_host_register(client, ns):
    # The README's cudaHostRegister recipe: the mapping's base address, and
    # a leased block's bytes at base + its offset in the pool.
    import ctypes
    base = ctypes.addressof(ctypes.c_char.from_buffer(client.pool))
    h = rand_hash()
    client.put(ns, h, b"registered" * 100)
    with client.lease(ns, h) as r:
        arr = np.frombuffer(r.buffer, dtype=np.uint8)
        addr = arr.__array_interface__["data"][0]
        assert base <= addr < base + client.pool_size
        assert ctypes.string_at(addr, 1000) == b"registered" * 100
        del arr
