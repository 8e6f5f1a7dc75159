"""Bad input raises the typed exceptions and changes nothing in the daemon;
the client stays usable afterwards."""

import numpy as np
import pytest

import pegad
from conftest import rand_hash


def snapshot(daemon):
    s = daemon.stats()
    return {k: s[k] for k in ("pool_used", "blocks", "pinned_blocks")}


CASES = [
    # (name, call, exception)
    ("namespace not str", lambda c, ns: c.put(7, b"h", b"x"), pegad.WrongType),
    ("hash not bytes", lambda c, ns: c.put(ns, "abc", b"x"), pegad.WrongType),
    ("hash int", lambda c, ns: c.get(ns, 12, bytearray(1)), pegad.WrongType),
    ("data not a buffer", lambda c, ns: c.put(ns, b"h", [1, 2, 3]), pegad.WrongType),
    ("data str", lambda c, ns: c.put(ns, b"h", "text"), pegad.WrongType),
    ("get into bytes", lambda c, ns: c.get(ns, b"h", b"readonly"), pegad.WrongType),
    ("size not int", lambda c, ns: c.alloc(ns, b"h", 1.5), pegad.WrongType),
    ("slots not pairs", lambda c, ns: c.alloc(ns, b"h", 10, slots=[1, 2]), pegad.WrongType),
    ("empty namespace", lambda c, ns: c.put("", b"h", b"x"), pegad.InvalidArgument),
    ("namespace too long", lambda c, ns: c.put("n" * 257, b"h", b"x"), pegad.InvalidArgument),
    ("empty hash", lambda c, ns: c.put(ns, b"", b"x"), pegad.InvalidArgument),
    ("hash too long", lambda c, ns: c.put(ns, b"h" * 65, b"x"), pegad.InvalidArgument),
    ("empty block", lambda c, ns: c.put(ns, b"h", b""), pegad.InvalidArgument),
    ("negative size", lambda c, ns: c.alloc(ns, b"h", -1), pegad.InvalidArgument),
    ("slots do not add up", lambda c, ns: c.alloc(ns, b"h", 10, slots=[(4, 4)]), pegad.InvalidArgument),
    ("empty K segment", lambda c, ns: c.alloc(ns, b"h", 4, slots=[(0, 4)]), pegad.InvalidArgument),
    ("too many slots", lambda c, ns: c.alloc(ns, b"h", 1025, slots=[(1, 0)] * 1025), pegad.InvalidArgument),
    ("not contiguous", lambda c, ns: c.put(ns, b"h", np.arange(100, dtype=np.uint8)[::2]), pegad.InvalidArgument),
    ("over the pool (put)", lambda c, ns: c.put(ns, b"h", bytearray(c.pool_size + 4096)), pegad.PoolFull),
    ("over the pool (alloc)", lambda c, ns: c.alloc(ns, b"h", 4 * c.pool_size), pegad.PoolFull),
    ("over the block limit", lambda c, ns: c.alloc(ns, b"h", 1 << 62), pegad.InvalidArgument),
    ("unknown namespace (get)", lambda c, ns: c.get("never-used-" + ns, b"h", bytearray(8)), pegad.NotFound),
    ("unknown namespace (lease)", lambda c, ns: c.lease("never-used-" + ns, b"h"), pegad.NotFound),
    ("unknown namespace (delete)", lambda c, ns: c.delete("never-used-" + ns, b"h"), pegad.NotFound),
    ("short buffer", lambda c, ns: c.get(ns, b"stored", bytearray(3)), pegad.ShortBuffer),
    ("get_batch lengths differ", lambda c, ns: c.get_batch(ns, [b"a", b"b"], [bytearray(1)]), pegad.InvalidArgument),
    ("prefetch hash not bytes", lambda c, ns: c.prefetch(ns, ["x"], peer="127.0.0.1:1"), pegad.WrongType),
]


@pytest.mark.parametrize("name,call,exc", CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_typed_and_changes_nothing(client, daemon, ns, name, call, exc):
    client.put(ns, b"stored", b"0123456789")
    before = snapshot(daemon)
    with pytest.raises(exc) as info:
        call(client, ns)
    assert isinstance(info.value, pegad.PegadError)
    assert snapshot(daemon) == before
    # The connection survived: the next call works.
    out = bytearray(10)
    assert client.get(ns, b"stored", out) == 10 and out == b"0123456789"


def test_short_buffer_says_the_size(client, ns):
    client.put(ns, b"s", b"x" * 1000)
    with pytest.raises(pegad.ShortBuffer) as info:
        client.get(ns, b"s", bytearray(999))
    assert info.value.needed == 1000


def test_batch_items_fail_alone(client, daemon, ns):
    good = rand_hash()
    res = client.put_batch(ns, [(good, b"ok"), (b"", b"x"), ("str", b"x"), (rand_hash(), b"")])
    assert res[0] is True
    assert all(isinstance(r, pegad.InvalidArgument) for r in res[1:])
    assert isinstance(res[2], pegad.WrongType)


def test_finished_leases(client, ns):
    h = rand_hash()
    client.put(ns, h, b"abc")
    w = client.alloc(ns, rand_hash(), 3)
    w.abort()
    w.abort()  # no-op after the first
    assert w.commit() is False  # finished already: nothing sent, nothing stored
    r = client.lease(ns, h)
    client.close()
    r.release()  # the daemon ended it when the client closed
    with pytest.raises(pegad.ClientClosed):
        client.lease(ns, h)


def test_no_daemon_is_unavailable(tmp_path):
    with pytest.raises(pegad.Unavailable):
        pegad.Client(str(tmp_path / "nothing.sock"))
    with pytest.raises(pegad.Unavailable):
        pegad.Client(tmp_path / "nothing.sock")  # a Path works too
    with pytest.raises(pegad.WrongType):
        pegad.Client(42)


def test_interrupted_call_breaks_the_connection_not_the_stream(daemon, ns, monkeypatch):
    # A call interrupted between request and response (Ctrl-C) must not let
    # the next call read the stale response as its own.
    c = pegad.Client(daemon.socket)
    try:
        c.put(ns, b"k", b"v")
        real = c._data._read_frame

        def interrupted():
            raise KeyboardInterrupt

        monkeypatch.setattr(c._data, "_read_frame", interrupted)
        with pytest.raises(KeyboardInterrupt):
            c.lease(ns, b"k")
        monkeypatch.setattr(c._data, "_read_frame", real)
        # The next call dials a new connection: a fresh stream, no stale answer.
        out = bytearray(1)
        assert c.get(ns, b"k", out) == 1 and out == b"v" and c.reconnects == 1
    finally:
        c.close()
    # The daemon ended the lease the interrupted call took.
    from harness import wait_until
    wait_until("the interrupted lease to end", lambda: daemon.stats()["pinned_blocks"] == 0)


def test_block_status_names():
    """Prefetch statuses are lower-case as pegactl prints them; the upper-case
    names of 0.1.0 still compare equal (deprecated aliases)."""
    s = pegad.BlockStatus("missing_on_peer")
    assert str(s) == "missing_on_peer" and s == "missing_on_peer"
    assert s == "MISSING_ON_PEER" and s != "FETCHED" and not (s != "MISSING_ON_PEER")
    assert s in ("FETCHED", "MISSING_ON_PEER") and hash(s) == hash("missing_on_peer")
    assert s != 3
