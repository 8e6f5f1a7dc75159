"""Prefix lookups, pins adopted by a second client, the *_async calls and
one client hammered by several threads, against a real daemon."""

import concurrent.futures
import threading

import pytest

import pegad


def chain(n, tag=b""):
    return [tag + b"h%05d" % i for i in range(n)]


def put_chain(c, ns, hs, size=256):
    for i, h in enumerate(hs):
        c.put(ns, h, bytes([i % 256]) * size)


def test_lookup_prefix_and_ranks(client, ns):
    hs = chain(10)
    put_chain(client, ns + "@tp0", hs[:7])
    put_chain(client, ns + "@tp1", hs[:4])
    put_chain(client, ns + "@tp1", hs[5:7])  # a gap at 4
    cases = [(ns + "@tp0", hs, 7), (ns + "@tp1", hs, 4), (ns + "@tp1", hs[5:], 2), (ns + "@tp2", hs, 0),
             (ns + "@tp0", [], 0)]
    for space, chain_, want in cases:
        assert client.lookup(space, chain_) == want, (space, len(chain_))
    assert client.lookup_ranks(ns, 2, hs) == 4
    assert client.lookup_ranks(ns, 3, hs) == 0
    with pytest.raises(pegad.InvalidArgument):
        client.lookup_ranks(ns, 0, hs)


def test_lookup_longer_than_one_round_trip(client, ns):
    hs = chain(4100)
    client.put_batch(ns, [(h, b"x" * 64) for h in hs[:4098]])
    assert client.lookup(ns, hs) == 4098


def test_pin_adopted_by_second_client(daemon, client, ns):
    hs = chain(6)
    put_chain(client, ns, hs[:4])
    pin = client.lookup_pin(ns, hs)
    assert pin.n == 4 and pin.token
    with pegad.Client(daemon.socket, timeout=60) as worker:
        forged = bytes(pin.token[:-1]) + bytes([pin.token[-1] ^ 1])
        for bad in (forged, b"", b"short"):
            with pytest.raises(pegad.NotFound):
                worker.adopt(bad)
        readers = worker.adopt(pin.token)
        assert [bytes(r.buffer) for r in readers] == [bytes([i]) * 256 for i in range(4)]
        with pytest.raises(pegad.NotFound):
            worker.adopt(pin.token)  # a second adopt changes nothing
        with pytest.raises(pegad.NotFound):
            pin.release()
        assert all(bytes(r.buffer) == bytes([i]) * 256 for i, r in enumerate(readers))
        worker.release_batch(readers)
    with client.lookup_pin(ns, hs) as p2:  # released on exit
        assert p2.n == 4
    with pytest.raises(pegad.NotFound):
        client.adopt(p2.token)


def test_async_calls(client, ns):
    hs = chain(8)
    fut = client.put_batch_async(ns, [(h, bytes([i]) * 512) for i, h in enumerate(hs)])
    assert isinstance(fut, concurrent.futures.Future)
    assert all(r is True or r is False for r in fut.result(timeout=30))
    outs = [bytearray(512) for _ in hs]
    got = client.get_batch_async(ns, hs, outs)
    assert got.result(timeout=30) == [512] * len(hs)
    assert got.done()
    assert [bytes(o) for o in outs] == [bytes([i]) * 512 for i in range(len(hs))]
    missing = client.get_batch_async(ns, [b"nope"], [bytearray(8)]).result(timeout=30)
    assert isinstance(missing[0], pegad.NotFound)


def test_threads_share_one_client(client, ns):
    """Scheduler-, worker- and save-like threads on one client at once:
    every call answers its own question."""
    errors = []
    stop = threading.Event()

    def saver(t):
        for i in range(60):
            client.put(ns, b"t%d-%d" % (t, i), bytes([t]) * 1024)

    def loader(t):
        out = bytearray(1024)
        for i in range(60):
            try:
                n = client.get(ns, b"t%d-%d" % (t, i), out)
                assert n == 1024 and out == bytes([t]) * 1024
            except pegad.NotFound:
                pass  # not saved yet

    def looker(t):
        hs = [b"t%d-%d" % (t, i) for i in range(60)]
        last = 0
        while not stop.is_set():
            n = client.lookup(ns, hs)
            assert n >= last  # the saver only adds
            last = n

    def run(f, t):
        try:
            f(t)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(f, t)) for t in range(3) for f in (saver, loader)]
    lookers = [threading.Thread(target=run, args=(looker, t)) for t in range(3)]
    for th in threads + lookers:
        th.start()
    for th in threads:
        th.join(60)
    stop.set()
    for th in lookers:
        th.join(60)
    assert not errors, errors
    assert client.lookup_ranks(ns, 1, []) == 0
    for t in range(3):
        assert client.lookup(ns, [b"t%d-%d" % (t, i) for i in range(60)]) == 60
