"""pegad._blocks, the connectors' batched leases, against a real pegad: one
object per call with each block's offset in the pool, the same outcomes
per block as Client.alloc_batch / lease_batch (Exists, NotFound, invalid
hashes in place), the fast numpy decoders agreeing with the generic one,
and a block the daemon placed outside the pool refused."""

import struct

import pytest

from pegad import _blocks, _wire as wire, errors
from conftest import rand_hash

SIZE = 4096


def _fill(batch, i, byte):
    off = batch.offsets[i]
    batch.pool[off:off + SIZE] = bytes([byte]) * SIZE


def test_alloc_commit_lease_release(client, ns):
    stored = rand_hash()
    assert client.put(ns, stored, b"s" * SIZE)
    hs = [rand_hash(), stored, b"", rand_hash(), rand_hash()]
    w = _blocks.alloc(client, ns, hs, SIZE)
    assert isinstance(w.errors[1], errors.Exists) and isinstance(w.errors[2], errors.InvalidArgument)
    assert w.held == [0, 3, 4] and all(w.offsets[i] is not None for i in w.held)
    for i in w.held:
        _fill(w, i, i)
    assert w.commit() == [(0, True), (3, True), (4, True)]
    assert w.held == [] and w.commit() == []  # each lease ends once

    r = _blocks.lease(client, ns, [hs[0], hs[3], rand_hash(), hs[4]])
    assert r.prefix(SIZE) == 2 and isinstance(r.errors[2], errors.NotFound) and r.held == [0, 1, 3]
    for j, i in ((0, 0), (1, 3), (3, 4)):
        assert bytes(r.pool[r.offsets[j]:r.offsets[j] + SIZE]) == bytes([i]) * SIZE
        assert r.sizes[j] == SIZE
    r.release()
    r.release()  # nothing left: no call, no error
    out = bytearray(SIZE)
    client.get(ns, hs[3], out)
    assert out == bytes([3]) * SIZE


def test_abort_gives_the_room_back(client, ns):
    hs = [rand_hash() for _ in range(3)]
    w = _blocks.alloc(client, ns, hs, SIZE)
    w.abort()
    assert client.lookup(ns, hs) == 0
    w2 = _blocks.alloc(client, ns, hs, SIZE)  # not Exists: nothing was stored
    assert w2.errors == [None] * 3
    w2.abort()


def test_a_block_of_two_slots_is_whole_through_the_generic_decoder(client, ns):
    h = rand_hash()
    data = bytes(range(256)) * 64
    assert client.put(ns, h, data, slots=[(4096, 4096), (4096, 4096)])
    r = _blocks.lease(client, ns, [h])
    assert r.sizes == [len(data)] and bytes(r.pool[r.offsets[0]:r.offsets[0] + len(data)]) == data
    r.release()


def test_adopt_and_fit(client, ns):
    hs = [rand_hash() for _ in range(3)]
    for h in hs:
        assert client.put(ns, h, b"x" * SIZE)
    r = _blocks.adopt(client, client.lookup_pin(ns, hs))
    assert r.prefix(SIZE) == 3
    r.fit(5)  # the scheduler pinned fewer blocks than are loaded
    assert r.prefix(SIZE) == 3 and isinstance(r.errors[4], errors.NotFound) and r.held == [0, 1, 2]
    r.fit(2)  # more: the rest released now
    assert len(r) == 2 and r.held == [0, 1]
    r.release()
    with pytest.raises(errors.NotFound):
        _blocks.adopt(client, b"no such pin")


def _alloc_ok(lease, off, ln):
    return bytes([wire.ST_OK]) + struct.pack("<QQQ", lease, off, ln)


def _lease_ok(lease, places):
    return bytes([wire.ST_OK]) + struct.pack("<QH", lease, len(places)) + b"".join(
        struct.pack("<QQQQ", *p) for p in places)


def _err(msg=b"no"):
    return bytes([wire.ST_NOT_FOUND]) + struct.pack("<H", len(msg)) + msg


@pytest.mark.parametrize("items", [
    [_alloc_ok(1, 0, 8), _alloc_ok(2, 8, 8)],
    [_alloc_ok(1, 0, 8), _err(b"x" * 22), _alloc_ok(3, 16, 8)],  # an error of an ok result's size
    [_err()],
])
def test_fast_alloc_decoder_agrees_with_the_generic(items):
    body = memoryview(b"".join(items))
    want = wire.decode_results(wire.OP_ALLOC, body, len(items))
    got = _blocks._decode_alloc(wire.OP_ALLOC, body, len(items))
    assert [str(x) if isinstance(x, Exception) else tuple(x) for x in got] == \
        [str(x) if isinstance(x, Exception) else tuple(x) for x in want]


@pytest.mark.parametrize("items,want", [
    ([_lease_ok(1, [(64, 8, 0, 0)]), _lease_ok(2, [(0, 8, 8, 8)])], [(1, 64, 8), (2, 0, 16)]),
    ([_lease_ok(1, [(0, 8, 32, 8)])], [(1, None, 16)]),  # K and V apart (fetched from a peer)
    ([_lease_ok(1, [(0, 8, 8, 8), (16, 8, 24, 8)]), _err()], [(1, 0, 32), "not_found"]),
])
def test_fast_lease_decoder_agrees_with_the_generic(items, want):
    body = memoryview(b"".join(items))
    got = _blocks._decode_lease(wire.OP_LEASE, body, len(items))
    assert ["not_found" if isinstance(x, errors.NotFound) else x for x in got] == want


class _Conn:
    """A data connection answering every call with reply's results."""

    def __init__(self, reply, pool_size):
        self.view = memoryview(bytearray(pool_size))
        self.pool_size = pool_size
        self.version = wire.VERSION
        self.reply = reply
        self.calls = []
        self.items = []  # each call's encoded items

    def call(self, op, items, timeout=None, decode=wire.decode_results):
        self.calls.append((op, len(items)))
        self.items.append(list(items))
        body = self.reply if op in (wire.OP_ALLOC, wire.OP_ALLOC_ON) else bytes(len(items))
        return decode(op, memoryview(body), len(items))


def test_a_block_outside_the_pool_is_refused_and_aborted():
    conn = _Conn(_alloc_ok(1, 0, SIZE) + _alloc_ok(2, 2 * SIZE, SIZE), 2 * SIZE)
    fake = type("C", (), {"_conn": lambda self: conn})()
    w = _blocks.alloc(fake, "ns", [b"a", b"b"], SIZE)
    assert w.offsets == [0, None] and isinstance(w.errors[1], errors.ProtocolError)
    assert conn.calls == [(wire.OP_ALLOC, 2), (wire.OP_ABORT, 1)] and w.held == [0]



def test_a_chunked_save_is_not_evicted_for_its_own_later_chunks(bins, monkeypatch):
    """The worker saves in chunks; every chunk's room is taken before any
    commit, so a save of half a full pool never evicts its own first
    chunks (whatever the policy ranks first) and loads right after it find
    every block. (Committing each chunk as it was copied let the prefix
    policy evict them: the bench's sixth load found none.)"""
    torch = pytest.importorskip("torch")
    import harness
    from pegad import _vllm_worker
    from pegad.vllm import BlockRun, PegadConnector, PegadConnectorMetadata
    from tinyengine import vllm_config
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    monkeypatch.setattr(_vllm_worker, "CHUNK_BYTES", 64 << 10)  # 16 chunks of 16 blocks
    nb, bs, heads, dim, layers, n = 300, 4, 2, 64, 2, 256  # 4 KiB a block, 1 MiB a save
    daemon = harness.Daemon(bins, "chunks", pool_size="2MiB")
    try:
        caches = [torch.randint(-2 ** 15, 2 ** 15, (2, nb, bs, heads, dim), dtype=torch.int16).view(torch.float16)
                  for _ in range(layers)]
        names = [f"layers.{i}.attn" for i in range(layers)]
        cfg = vllm_config(daemon.socket, 1, bs, {"namespace": "chunks"})
        mc = cfg.model_config
        mc.get_num_kv_heads, mc.get_total_num_kv_heads, mc.get_head_size = lambda pc: heads, lambda: heads, lambda: dim
        c = PegadConnector(cfg, KVConnectorRole.WORKER)
        c.register_kv_caches(dict(zip(names, caches)))
        assert c.block_bytes * n == 1 << 20
        try:
            for it in range(8):
                ids = list(range(it % 2, it % 2 + n))
                hashes = [b"c-%d-%d" % (it, j) for j in range(n)]
                for meta in (PegadConnectorMetadata(saves=[BlockRun("r", ids, hashes)]),
                             PegadConnectorMetadata(loads=[BlockRun("r", ids[::-1], hashes)])):
                    c.bind_connector_metadata(meta)
                    c.start_load_kv(None)
                    c.wait_for_save()
                    c.clear_connector_metadata()
                    c.flush(60)
                assert c.get_finished(set())[1] == {"r"}
                assert c.get_block_ids_with_load_errors() == set(), f"iteration {it}"
            assert c.stats["load_error_blocks"] == 0 and c.stats["saved_blocks"] == 8 * n
        finally:
            c.shutdown()
    finally:
        daemon.stop()


@pytest.mark.parametrize("node,version,op", [
    (1, wire.VERSION, wire.OP_ALLOC_ON),
    (0, wire.VERSION, wire.OP_ALLOC_ON),
    (None, wire.VERSION, wire.OP_ALLOC),
    (wire.NO_NODE, wire.VERSION, wire.OP_ALLOC),  # no preference: plain ALLOC
    (1, 3, wire.OP_ALLOC),  # a daemon older than version 4 places blocks anywhere
])
def test_alloc_sends_the_numa_node(node, version, op):
    """A save asking for a NUMA node sends ALLOC_ON with the node before
    each item's key, to a daemon that speaks it."""
    conn = _Conn(_alloc_ok(1, 0, SIZE) + _alloc_ok(2, SIZE, SIZE), 2 * SIZE)
    conn.version = version
    fake = type("C", (), {"_conn": lambda self: conn})()
    w = _blocks.alloc(fake, "ns", [b"a", b"b"], SIZE, numa_node=node)
    assert w.offsets == [0, SIZE] and conn.calls == [(op, 2)]
    plain = [wire.alloc_item(b"ns", h, [(SIZE, 0)]) for h in (b"a", b"b")]
    if op == wire.OP_ALLOC_ON:
        assert conn.items[0] == [struct.pack("<i", node) + it for it in plain]
    else:
        assert conn.items[0] == plain


@pytest.mark.parametrize("node", [-2, 1024, 1.0, True, "0"])
def test_alloc_refuses_a_bad_numa_node(node):
    conn = _Conn(b"", SIZE)
    fake = type("C", (), {"_conn": lambda self: conn})()
    with pytest.raises(errors.InvalidArgument, match="NUMA node"):
        _blocks.alloc(fake, "ns", [b"a"], SIZE, numa_node=node)
    assert conn.calls == []  # nothing sent


def test_alloc_on_a_numa_node_against_pegad(client, ns):
    """The daemon reports its pool's parts, and takes ALLOC_ON for the node
    of a part and for a node it has no part on (it falls back)."""
    parts = client.pool_parts
    assert client.protocol_version == wire.VERSION >= 4
    assert parts and parts[0][1] == 0 and sum(p[2] for p in parts) == client.pool_size
    for node in (parts[0][0] if parts[0][0] >= 0 else 0, 7):
        hs = [rand_hash(), rand_hash()]
        w = _blocks.alloc(client, ns, hs, SIZE, numa_node=node)
        assert w.held == [0, 1], w.errors
        for i in w.held:
            _fill(w, i, i + 1)
        assert w.commit() == [(0, True), (1, True)]
        (wr,) = client.alloc_batch([(ns, rand_hash(), SIZE)], numa_node=node)
        assert not isinstance(wr, Exception), wr
        wr.abort()
        r = _blocks.lease(client, ns, hs)
        assert r.held == [0, 1] and bytes(r.pool[r.offsets[1]:r.offsets[1] + SIZE]) == b"\x02" * SIZE
        r.release()
    with pytest.raises(errors.InvalidArgument, match="NUMA node"):
        client.alloc_batch([(ns, rand_hash(), SIZE)], numa_node=-5)
