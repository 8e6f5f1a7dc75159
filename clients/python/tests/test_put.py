"""put in one round trip (protocol version 2): it copies into the room the
previous put reserved and PUT commits it and reserves the next; against a
daemon that speaks only version 1 the client dials again with it."""

import os
import socket
import struct
import threading
import time

import pegad
from pegad import _wire as wire
from conftest import rand_hash


def trips(c, f):
    """How many requests f sent on c's data connection."""
    before = c._data._seq
    f()
    return c._data._seq - before


def test_put_round_trips(client, ns):
    assert client._data.version == wire.VERSION
    data = os.urandom(65536)
    assert trips(client, lambda: client.put(ns, rand_hash(), data)) == 2  # reserve, put
    for _ in range(3):
        assert trips(client, lambda: client.put(ns, rand_hash(), data)) == 1
    h = rand_hash()
    assert client.put(ns, h, data) is True
    res = []
    assert trips(client, lambda: res.append(client.put(ns, h, os.urandom(65536)))) == 1
    assert res == [False]  # stored already: the first put's bytes stay
    out = bytearray(65536)
    assert client.get(ns, h, out) == 65536 and out == data
    assert trips(client, lambda: client.put(ns, rand_hash(), b"y" * 1000)) == 3  # abort, reserve, put
    # A key the daemon refuses leaves the spare for the next put.
    try:
        client._put_reserved(b"", b"h", [(1000, 0)], memoryview(b"z" * 1000))
        raise AssertionError("an empty namespace was accepted")
    except pegad.InvalidArgument:
        pass
    assert trips(client, lambda: client.put(ns, rand_hash(), b"z" * 1000)) == 1


def test_put_spare_goes_with_the_client(daemon, ns):
    before = daemon.stats()["pool_used"]
    with pegad.Client(daemon.socket) as c:
        assert c.put(ns, rand_hash(), b"x" * 65536)
        assert daemon.stats()["pool_used"] == before + 2 * 65536  # the block and the next put's room
    assert daemon.stats()["pool_used"] == before + 65536  # close gave the spare back before it returned


def test_version1_daemon(tmp_path):
    """A daemon that refuses version 2 gets a second HELLO with version 1."""
    path = str(tmp_path / "fake.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".data")
    srv.listen(2)
    fd = os.memfd_create("pegad-fake-pool")
    os.ftruncate(fd, 1 << 20)
    asked = []
    done = threading.Event()

    def serve():
        for _ in range(2):
            c, _ = srv.accept()
            with c:
                req = c.recv(64)
                (version,) = struct.unpack_from("<I", req, wire.HEADER_LEN)
                asked.append(version)
                if version != 1:
                    msg = b"protocol version 2, this daemon speaks 1"
                    c.sendall(wire.HEADER.pack(8 + len(msg), wire.OP_HELLO, wire.ST_INVALID, 0, 1) + msg)
                    continue
                reply = wire.HEADER.pack(8 + 20, wire.OP_HELLO, 0, 0, 1) + wire.HELLO_REPLY.pack(1, 1 << 20, 60000)
                socket.send_fds(c, [reply], [fd])
                done.wait(10)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pegad.Client(path, timeout=10) as c:
            assert c._data.version == 1
            assert c.pool_size == 1 << 20
    finally:
        done.set()
        t.join(10)
        os.close(fd)
    assert asked == [wire.VERSION, 1]


def _read_request(c):
    """The next request frame on c: (op, seq), or None when c closed."""
    head = b""
    while len(head) < wire.HEADER_LEN:
        got = c.recv(wire.HEADER_LEN - len(head))
        if not got:
            return None
        head += got
    length, op, _, _, seq = wire.HEADER.unpack(head)
    left = length - 8
    while left > 0:
        got = c.recv(left)
        if not got:
            return None
        left -= len(got)
    return op, seq


def test_close_with_a_wedged_daemon(tmp_path):
    """A daemon that stops answering after a put (stopped, wedged) holds
    close for at most about a second: the spare's ABORT is bounded as the
    Go client's is, whatever the client's own timeout (here none)."""
    path = str(tmp_path / "wedged.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".data")
    srv.listen(1)
    fd = os.memfd_create("pegad-fake-pool")
    os.ftruncate(fd, 1 << 20)
    aborts = []
    release = threading.Event()

    def answer(c, op, seq, item):
        c.sendall(wire.HEADER.pack(8 + 1 + len(item), op, 0, 1, seq) + b"\0" + item)

    def serve():
        c, _ = srv.accept()
        with c:
            req = c.recv(64)
            (version,) = struct.unpack_from("<I", req, wire.HEADER_LEN)
            reply = wire.HEADER.pack(8 + 20, wire.OP_HELLO, 0, 0, 1) + wire.HELLO_REPLY.pack(version, 1 << 20, 60000)
            socket.send_fds(c, [reply], [fd])
            while (r := _read_request(c)) is not None:
                op, seq = r
                if op == wire.OP_RESERVE:
                    answer(c, op, seq, struct.pack("<QQQ", 1, 0, 4096))
                elif op == wire.OP_PUT:  # stored; the next put's room is lease 2
                    answer(c, op, seq, struct.pack("<BBQQQ", 1, 0, 2, 4096, 4096))
                else:  # wedged from here on: read, never answer
                    aborts.append(op)
                    release.wait(30)
                    return
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    closed = threading.Event()
    took = []
    try:
        c = pegad.Client(path)  # no timeout of its own
        assert c.put("ns", b"h", b"x" * 4096) is True
        assert c._data._spare is not None

        def close():
            start = time.monotonic()
            c.close()
            took.append(time.monotonic() - start)
            closed.set()

        threading.Thread(target=close, daemon=True).start()
        assert closed.wait(3), "close hung on a daemon that never answers the spare's ABORT"
        assert took[0] < 2.5
        assert aborts == [wire.OP_ABORT]
    finally:
        release.set()
        t.join(10)
        os.close(fd)
        srv.close()
