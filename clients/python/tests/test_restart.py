"""A Client, and the connectors on it, outlive a restart of pegad (`systemctl
restart pegad`: SIGTERM, then a new daemon on the same socket): the next
call works, with no new Client and no engine restart (issue 33, item 8).
Leases of the old daemon end with it, and their ids never reach the new
one."""

import numpy as np
import pytest

import pegad
from pegad import _grpc, keys
from harness import Daemon
from test_sglang_engine import page_keys, storage
from test_vllm_engine import BS, TOL, max_diff, prompts
from tinyengine import Engine

CALLS = {
    "put": lambda c, ns: c.put(ns, b"after", b"a" * 5000),
    "get": lambda c, ns: _not_found(lambda: c.get(ns, b"missing", bytearray(10))),
    "alloc": lambda c, ns: _exists(lambda: c.alloc(ns, b"w", 4096).commit()),
    "lease_batch": lambda c, ns: c.lease_batch(ns, [b"missing"]),
    "lookup": lambda c, ns: c.lookup(ns, [b"before"]),
    "lookup_pin": lambda c, ns: c.lookup_pin(ns, [b"before"]).release(),
    "delete": lambda c, ns: _not_found(lambda: c.delete(ns, b"missing")),
    "prefetch": lambda c, ns: _no_index(lambda: c.prefetch(ns, [b"missing"], timeout=5)),
}


def _not_found(f):
    try:
        f()
    except pegad.NotFound:
        pass  # the new daemon's pool is empty


def _no_index(f):
    try:
        f()
    except pegad.FailedPrecondition:
        pass  # answered by the daemon (it has no cluster index): the channel works


def _exists(f):
    try:
        f()
    except pegad.Exists:
        pass  # the first call's block


@pytest.fixture
def restarted(bins):
    d = Daemon(bins, "py-restart")
    try:
        yield d
    finally:
        d.stop()


@pytest.mark.parametrize("call", sorted(CALLS))
def test_next_call_after_restart_works(restarted, ns, call):
    with pegad.Client(restarted.socket, timeout=30) as c:
        c.put(ns, b"before", b"b" * 5000)
        c.delete(ns, b"before")  # the gRPC channel is up too
        restarted.restart()
        for i in range(2):
            try:
                CALLS[call](c, ns)
            except pegad.PegadError as e:
                raise AssertionError(f"{call} number {i + 1} after the restart: {e!r}") from e
        if call not in ("delete", "prefetch"):
            assert c.reconnects == 1


def test_leases_end_with_their_connection(restarted, ns):
    """A reader and a writer of the old daemon fail after the restart; their
    lease ids (the same numbers the new daemon gives) never reach it."""
    with pegad.Client(restarted.socket, timeout=30) as c:
        c.put(ns, b"k", b"1" * 4096)
        old_r = c.lease(ns, b"k")
        old_w = c.alloc(ns, b"w", 4096)
        restarted.restart()
        c.put(ns, b"k", b"2" * 4096)
        new_r = c.lease(ns, b"k")
        new_w = c.alloc(ns, b"w", 4096)
        with pytest.raises(pegad.Unavailable):
            c.commit_batch([old_w])
        with pytest.raises(pegad.Unavailable):
            c.release_batch([old_r])
        assert restarted.stats()["pinned_blocks"] == 1  # new_r's pin is still there
        assert c.lookup(ns, [b"w"]) == 0  # old_w's commit stored nothing
        assert bytes(new_r.buffer) == b"2" * 4096 and new_r.pool is c.pool
        new_w.buffer[:] = b"3" * 4096
        assert new_w.commit()
        new_r.release()


def test_a_call_that_breaks_mid_flight_fails_and_the_next_works(restarted, ns, monkeypatch):
    """The daemon goes away while a request is on the wire: that call fails
    (it is not sent again: the daemon may have applied it), the next one
    dials again."""
    with pegad.Client(restarted.socket, timeout=30) as c:
        d = c._data
        real = d._read_frame

        def restart_then_read():
            restarted.restart()
            return real()

        monkeypatch.setattr(d, "_read_frame", restart_then_read)
        with pytest.raises(pegad.Unavailable):
            c.put(ns, b"k", b"x" * 4096)
        assert c.lookup(ns, [b"k"]) == 0  # not resent: the put reached only the old daemon
        assert c.put(ns, b"k", b"y" * 4096)
        out = bytearray(4096)
        assert c.get(ns, b"k", out) == 4096 and out == b"y" * 4096


def test_grpc_channel_options(monkeypatch, tmp_path):
    """The channel is dialled with the options _grpc documents: message and
    metadata limits past a 4096-block prefetch's answer, keepalive within
    what pegad's server allows, a reconnect backoff of at most a second."""
    seen = {}
    real = _grpc.grpc.insecure_channel

    def spy(target, options=None, **kw):
        seen.update(options or ())
        return real(target, options=options, **kw)

    monkeypatch.setattr(_grpc.grpc, "insecure_channel", spy)
    ch, _ = _grpc.dial(str(tmp_path / "none.sock"))
    ch.close()
    assert seen["grpc.max_receive_message_length"] >= 4096 * 1400
    assert seen["grpc.max_metadata_size"] >= 4096 * 1400 * 4 // 3
    assert seen["grpc.keepalive_time_ms"] > 5 * 60 * 1000  # grpc-go's server: GOAWAY below 5 minutes
    assert seen["grpc.keepalive_permit_without_calls"] == 0
    assert seen["grpc.max_reconnect_backoff_ms"] <= 1000


def test_vllm_connector_survives_restart(restarted, ns):
    """One engine (scheduler and worker) across a pegad restart: what it
    serves after the restart is saved and loaded again. retry is long, so
    an engine that needed its connector to fail and re-dial would lose
    every save after the restart."""
    extra = {"namespace": ns, "retry": 300}
    prompt, longer = prompts(31)
    with Engine(restarted.socket, block_size=BS, extra=extra) as e:
        e.serve("a", prompt)
        before = e.worker_stats()[0]["saved_blocks"]
        restarted.restart()
        e.serve("b", prompt)  # the new pool is empty: computed, then saved
        stats = e.worker_stats()[0]
        assert stats["save_dropped_blocks"] == 0 and stats["saved_blocks"] == 2 * before > 0, stats
        got, gen = e.serve("c", longer)
        events = e.events
    with Engine(None, block_size=BS) as ref:
        want, want_gen = ref.serve("ref", longer)
    assert ("loaded", 5) in events and not any(ev[0] == "load_errors" for ev in events)
    assert max_diff(got, want) < TOL and gen == want_gen
    with pegad.Client(restarted.socket) as c:
        from tinyengine import block_hashes
        assert c.lookup(keys.rank_namespace(ns, 0), block_hashes(prompt, BS)) == 5


def test_sglang_backend_survives_restart(restarted, ns):
    s, _ = storage(restarted.socket, "page_first", ns)
    s.link.retry = 300  # as above: no re-dial after a failure within the test
    k = page_keys(list(range(8)))
    assert s.set(k[0], np.arange(16, dtype=np.float32))
    restarted.restart()
    assert not s.exists(k[0])  # the new pool is empty
    assert s.set(k[1], np.arange(16, dtype=np.float32) * 2)
    out = np.zeros(16, np.float32)
    s.get(k[1], out)
    # set/get/exists are the generic calls (their own namespace, pegad.sglang):
    # batch_exists answers for the v1 calls only.
    assert (out == np.arange(16) * 2).all() and s.exists(k[1])
    s.close()
