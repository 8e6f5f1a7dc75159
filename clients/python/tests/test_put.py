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
    assert client.protocol_version == wire.VERSION >= 2  # RESERVE and PUT arrived in version 2
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
    """A daemon that refuses the newer versions gets a HELLO of each older
    one in turn, down to version 1."""
    path = str(tmp_path / "fake.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path + ".data")
    srv.listen(2)
    fd = os.memfd_create("pegad-fake-pool")
    os.ftruncate(fd, 1 << 20)
    asked = []
    done = threading.Event()

    def serve():
        for _ in range(wire.VERSION):
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
    assert asked == list(range(wire.VERSION, 0, -1))



def _recv(c, n):
    out = b""
    while len(out) < n:
        got = c.recv(n - len(out))
        if not got:
            return None
        out += got
    return out


class _FakeDaemon:
    """A data socket that says HELLO (a 1 MiB memfd pool) and then answers
    each request with answer(op, body): one ok payload per item, or None
    to answer nothing more (a wedged daemon). requests: (op, body) read."""

    POOL = 1 << 20

    def __init__(self, tmp_path, answer):
        self.path = str(tmp_path / "fake.sock")
        self.requests = []
        self._answer = answer
        self._release = threading.Event()
        self._srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._srv.bind(self.path + ".data")
        self._srv.listen(1)
        self._fd = os.memfd_create("pegad-fake-pool")
        os.ftruncate(self._fd, self.POOL)
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def _serve(self):
        c, _ = self._srv.accept()
        with c:
            req = c.recv(64)
            (version,) = struct.unpack_from("<I", req, wire.HEADER_LEN)
            hello = wire.hello_reply(version, self.POOL, 60000, [(0, 0, self.POOL)])
            reply = wire.HEADER.pack(8 + len(hello), wire.OP_HELLO, 0, 0, 1) + hello
            socket.send_fds(c, [reply], [self._fd])
            while (head := _recv(c, wire.HEADER_LEN)) is not None:
                length, op, _, count, seq = wire.HEADER.unpack(head)
                body = _recv(c, length - 8)
                if body is None:
                    return
                self.requests.append((op, body))
                items = self._answer(op, body)
                if items is None:
                    self._release.wait(30)
                    return
                payload = b"".join(b"\0" + it for it in items)
                c.sendall(wire.HEADER.pack(8 + len(payload), op, 0, count, seq) + payload)

    def close(self):
        self._release.set()
        self._t.join(10)
        os.close(self._fd)
        self._srv.close()


def test_close_with_a_wedged_daemon(tmp_path):
    """A daemon that stops answering after a put (stopped, wedged) holds
    close for at most about a second: the spare's ABORT is bounded as the
    Go client's is, whatever the client's own timeout (here none)."""
    def answer(op, body):
        if op == wire.OP_RESERVE:
            return [struct.pack("<QQQ", 1, 0, 4096)]
        if op == wire.OP_PUT:  # stored; the next put's room is lease 2
            return [struct.pack("<BBQQQ", 1, 0, 2, 4096, 4096)]
        return None  # wedged from here on: read, never answer

    fake = _FakeDaemon(tmp_path, answer)
    closed = threading.Event()
    took = []
    try:
        c = pegad.Client(fake.path)  # no timeout of its own
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
        assert fake.requests[-1] == (wire.OP_ABORT, struct.pack("<Q", 2))
    finally:
        fake.close()


def test_room_outside_the_pool_is_refused_and_given_back(tmp_path):
    """Room the daemon names outside the mapped pool (ALLOC, LEASE,
    RESERVE) is a ProtocolError, never a view of the wrong bytes, and its
    lease is given back at once."""
    out = _FakeDaemon.POOL

    def answer(op, body):
        if op == wire.OP_ALLOC:
            return [struct.pack("<QQQ", 1, out - 100, 4096)]
        if op == wire.OP_LEASE:
            return [struct.pack("<QHQQQQ", 2, 1, out, 64, 0, 0)]
        if op == wire.OP_RESERVE:
            return [struct.pack("<QQQ", 3, out + 4096, 4096)]
        return [b""]  # ABORT, RELEASE: ok

    fake = _FakeDaemon(tmp_path, answer)
    try:
        with pegad.Client(fake.path, timeout=10) as c:
            (r,) = c.alloc_batch([("ns", b"a", 4096)])
            assert isinstance(r, pegad.ProtocolError) and "outside the pool" in str(r)
            (r,) = c.lease_batch("ns", [b"b"])
            assert isinstance(r, pegad.ProtocolError) and "outside the pool" in str(r)
            try:
                c.put("ns", b"c", b"z" * 4096)
                raise AssertionError("a reservation outside the pool was used")
            except pegad.ProtocolError as e:
                assert "outside the pool" in str(e)
        given_back = [(op, body) for op, body in fake.requests if op in (wire.OP_ABORT, wire.OP_RELEASE)]
        assert given_back == [(wire.OP_ABORT, struct.pack("<Q", 1)), (wire.OP_RELEASE, struct.pack("<Q", 2)),
                              (wire.OP_ABORT, struct.pack("<Q", 3))]
    finally:
        fake.close()
