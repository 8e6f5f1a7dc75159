"""The wire decoders against malformed daemon answers (no daemon needed):
a ProtocolError, never an IndexError or struct.error."""

import socket
import struct
import threading

import pytest

import pegad
from pegad import _wire as wire

ALLOC_OK = b"\x00" + struct.pack("<QQQ", 7, 4096, 100)
LEASE_OK = b"\x00" + struct.pack("<QH", 9, 1) + struct.pack("<QQQQ", 0, 10, 10, 5)


@pytest.mark.parametrize("op,body,count", [
    (wire.OP_ALLOC, ALLOC_OK[:-1], 1),                      # truncated payload
    (wire.OP_ALLOC, ALLOC_OK + b"\x00", 1),                  # trailing byte
    (wire.OP_ALLOC, ALLOC_OK, 2),                            # fewer items than count
    (wire.OP_COMMIT, b"\x00\x02", 1),                        # created not 0/1
    (wire.OP_LEASE, LEASE_OK[:-8], 1),                       # slot table cut short
    (wire.OP_LEASE, b"\x00" + struct.pack("<QH", 9, 0), 1),  # zero slots
    (wire.OP_RELEASE, b"\x01" + struct.pack("<H", 2000) + b"x" * 2000, 1),  # message over the limit
    (wire.OP_RELEASE, b"\x01" + struct.pack("<H", 5) + b"abc", 1),          # message cut short
])
def test_malformed_results(op, body, count):
    with pytest.raises(pegad.ProtocolError):
        wire.decode_results(op, body, count)


def test_results_decode():
    assert wire.decode_results(wire.OP_ALLOC, ALLOC_OK, 1) == [(7, 4096, 100)]
    assert wire.decode_results(wire.OP_LEASE, LEASE_OK, 1) == [(9, [(0, 10, 10, 5)])]
    (err,) = wire.decode_results(wire.OP_LEASE, b"\x01" + struct.pack("<H", 4) + b"gone", 1)
    assert isinstance(err, pegad.NotFound) and "gone" in str(err)
    (err,) = wire.decode_results(wire.OP_ABORT, b"\x08\x00\x00", 1)
    assert isinstance(err, pegad.Unavailable)  # 8: closed (daemon shutting down)


def fake_daemon(path, reply):
    """A unix server that answers the HELLO with reply (no fd) and closes."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve():
        c, _ = srv.accept()
        with c:
            c.recv(64)
            c.sendall(reply)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("reply,exc", [
    (wire.HEADER.pack(8 + 20, wire.OP_HELLO, 0, 0, 1) + wire.HELLO_REPLY.pack(1, 1 << 20, 1000), pegad.ProtocolError),  # no memfd
    (wire.HEADER.pack(8 + 5, wire.OP_HELLO, 3, 0, 1) + b"nope!", pegad.ProtocolError),  # refused
    (wire.HEADER.pack(8 + 20, wire.OP_HELLO, 0, 0, 1) + wire.HELLO_REPLY.pack(wire.VERSION + 1, 1 << 20, 1000), pegad.ProtocolError),  # version
    (b"", pegad.Unavailable),  # closed at once
    (wire.HEADER.pack(1 << 30, wire.OP_HELLO, 0, 0, 1), pegad.ProtocolError),  # absurd length
])
def test_bad_hello(tmp_path, reply, exc):
    sock = str(tmp_path / "fake.sock")
    t = fake_daemon(sock + ".data", reply)
    with pytest.raises(exc):
        pegad.Client(sock, timeout=10)
    t.join(10)
