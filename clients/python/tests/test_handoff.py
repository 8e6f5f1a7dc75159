"""Client.handoff and Client.prefetch(handoff=, known_peer_only=) against two
real daemons on loopback: a producer that hands blocks off, a consumer that
pulls them (docs/data-path.md "Handoffs")."""

import secrets

import pytest

import pegad
from conftest import rand_hash
from harness import Daemon, wait_until


@pytest.fixture(scope="module")
def producer(bins):
    d = Daemon(bins, "producer", extra=("--gc-interval", "50ms"))
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture(scope="module")
def consumer(bins):
    d = Daemon(bins, "consumer")
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def pc(producer):
    with pegad.Client(producer.socket, timeout=60) as c:
        yield c


@pytest.fixture
def cc(consumer):
    with pegad.Client(consumer.socket, timeout=60) as c:
        yield c


def stored(c, ns, n, size=4096):
    hashes = [rand_hash() for _ in range(n)]
    for h in hashes:
        c.put(ns, h, secrets.token_bytes(size))
    return hashes


def pinned(d):
    return d.stats()["pinned_blocks"]


def test_handoff_names_this_node_and_pins(producer, pc, ns):
    hs = stored(pc, ns, 3)
    before = pinned(producer)
    h = pc.handoff(ns, hs, ttl=10)
    try:
        assert (h.n, h.node_id, h.peer_addr, h.ttl) == (3, "producer", producer.listen, 10.0)
        assert isinstance(h.token, str) and len(h.token) == 48
        assert pinned(producer) == before + 3
    finally:
        assert h.release() is True
    assert pinned(producer) == before
    assert h.release() is False  # idempotent


def test_handoff_of_a_missing_block_pins_nothing(producer, pc, ns):
    hs = stored(pc, ns, 2) + [rand_hash()]
    before = pinned(producer)
    with pytest.raises(pegad.NotFound, match="1 of 3 blocks"):
        pc.handoff(ns, hs)
    assert pinned(producer) == before


@pytest.mark.parametrize("ttl", [0, -1, "30", True])
def test_handoff_ttl_must_be_positive(pc, ns, ttl):
    with pytest.raises(pegad.InvalidArgument):
        pc.handoff(ns, [rand_hash()], ttl=ttl)


def test_handoff_ttl_is_bounded_by_the_daemon(pc, ns):
    hs = stored(pc, ns, 1)
    with pytest.raises(pegad.InvalidArgument, match="ttl"):
        pc.handoff(ns, hs, ttl=301)


def test_consumer_pull_ends_the_handoff(producer, pc, cc, ns):
    hs = stored(pc, ns, 4)
    before = pinned(producer)
    h = pc.handoff(ns, hs)
    res = cc.prefetch(ns, hs, peer=h.peer_addr, handoff=h.token)
    assert [b.status for b in res.blocks] == ["fetched"] * 4
    wait_until("the handoff's pins to end", lambda: pinned(producer) == before)
    assert producer.stats()["sessions_active"] == 0
    assert h.release() is False  # the pull ended it
    assert cc.lookup(ns, hs) == 4


def test_partial_pull_keeps_the_rest_pinned(producer, pc, cc, ns):
    hs = stored(pc, ns, 3)
    before = pinned(producer)
    h = pc.handoff(ns, hs)
    cc.prefetch(ns, hs[:1], peer=h.peer_addr, handoff=h)  # a Handoff passes as its token
    wait_until("the pulled block's pin to end", lambda: pinned(producer) == before + 2)
    assert h.release() is True
    assert pinned(producer) == before


def test_handoff_expires(producer, pc, ns):
    hs = stored(pc, ns, 2)
    before = pinned(producer)
    h = pc.handoff(ns, hs, ttl=0.3)
    assert pinned(producer) == before + 2
    wait_until("the handoff to expire", lambda: pinned(producer) == before, timeout=10)
    assert h.release() is False


def test_unknown_token_changes_nothing(producer, pc, cc, ns):
    hs = stored(pc, ns, 2)
    res = cc.prefetch(ns, hs, peer=producer.listen, handoff="00" * 24)
    assert [b.status for b in res.blocks] == ["fetched"] * 2


def test_known_peer_only_without_an_index_refuses(producer, pc, cc, ns):
    hs = stored(pc, ns, 1)
    with pytest.raises(pegad.Denied, match="no cluster index and no --peer-allow") as e:
        cc.prefetch(ns, hs, peer=producer.listen, known_peer_only=True)
    assert producer.listen in str(e.value)
    assert isinstance(e.value, PermissionError)
    assert cc.lookup(ns, hs) == 0
    assert producer.stats()["sessions_active"] == 0


@pytest.mark.parametrize("bad", [{"handoff": 5}, {"known_peer_only": "yes"}])
def test_prefetch_argument_types(cc, ns, bad):
    with pytest.raises(pegad.WrongType):
        cc.prefetch(ns, [rand_hash()], peer="127.0.0.1:1", **bad)
