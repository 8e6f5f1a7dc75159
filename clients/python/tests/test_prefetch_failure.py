"""A failed prefetch's per-block outcomes reach the Python client whole,
however many blocks it named (issue 33, item 5): they come in the response
(failure_in_response), not in a status trailer that outgrows the channel's
header-list limit."""

import socket

import pytest

import pegad
from conftest import rand_hash


def _dead_peer():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    addr = "127.0.0.1:%d" % s.getsockname()[1]
    s.close()
    return addr


def test_failed_prefetch_of_4096_blocks_keeps_every_outcome(daemon, ns):
    hashes = [rand_hash() + bytes(48) for _ in range(4096)]  # 64-byte hashes: the largest answer
    with pegad.Client(daemon.socket, timeout=60) as c:
        with pytest.raises(pegad.Unavailable) as e:
            c.prefetch(ns, hashes, peer=_dead_peer(), timeout=30)
    res = e.value.result
    assert res is not None and len(res.blocks) == 4096
    assert [b.hash for b in res.blocks] == hashes
    assert all(str.__eq__(b.status, "failed") and b.error for b in res.blocks)
