"""Leases of many blocks held as one object: the engine connectors' data
path over the local data socket (docs/local-protocol.md: ALLOC, COMMIT,
ABORT, LEASE, RELEASE, ADOPT).

Client.alloc_batch and lease_batch hand out one Writer or Reader per block,
each with its own lock and views of the pool: some 10 us a block in
Python, a fifth of what copying a 256 KiB block costs. A serving engine's
step moves hundreds of blocks at once, so here a batch is one object that
holds, per block, its lease id and its offset in the pool, and the
replies are decoded with numpy when every item succeeded (the fixed-size
common case), falling back to the generic decoder otherwise.

It owns a batch's leases until commit, abort or release; it must never
copy block bytes, never build a per-block view and never talk to the
daemon but through the client's data connection.
"""

import threading

import numpy as np

from . import _wire as wire
from . import errors
from ._handles import _namespace

__all__ = ["Reservations", "Leases", "alloc", "lease", "adopt"]

# The ok results of one item, as the daemon writes them (packed, little-endian).
_ALLOC_OK = np.dtype([("st", "u1"), ("lease", "<u8"), ("off", "<u8"), ("len", "<u8")])
_PLACE = [("koff", "<u8"), ("klen", "<u8"), ("voff", "<u8"), ("vlen", "<u8")]
_LEASE_OK = np.dtype([("st", "u1"), ("lease", "<u8"), ("slots", "<u2")] + _PLACE)  # one slot
_ADOPTED = np.dtype([("lease", "<u8"), ("slots", "<u2")] + _PLACE)  # one slot of ADOPT's list
_COMMIT_OK = np.dtype([("st", "u1"), ("created", "u1")])


class _Batch:
    """Leases of one call on one data connection; index i is the call's
    i-th block."""

    def __init__(self, conn, n):
        self._d = conn
        self.pool = conn.view  # the mapping offsets are into (a reconnect maps a new one)
        self.offsets = [None] * n  # each block's first byte in pool; None: no usable lease
        self.sizes = [0] * n  # each block's bytes
        self.errors = [None] * n  # None, or the exception saying why the block has no lease
        self._mu = threading.Lock()  # guards _ids
        self._ids = [None] * n  # each block's lease id while held

    def __len__(self):
        return len(self._ids)

    @property
    def held(self):
        """Indexes of the blocks whose leases this batch still holds."""
        with self._mu:
            return [i for i, x in enumerate(self._ids) if x is not None]

    def _take(self, which):
        """(index, lease id) of the blocks in which (None: all) still held,
        no longer held from now on: each lease is ended once."""
        with self._mu:
            out = []
            for i in range(len(self._ids)) if which is None else which:
                x = self._ids[i]
                if x is not None:
                    self._ids[i] = None
                    out.append((i, x))
            return out

    def _end(self, op, which):
        """ABORT or RELEASE the leases of which; the first item error,
        raised after trying them all."""
        first = None
        taken = self._take(which)
        for p in range(0, len(taken), wire.MAX_BATCH):
            part = taken[p:p + wire.MAX_BATCH]
            try:
                res = self._d.call(op, [wire.lease_id(x) for _, x in part], decode=_decode_ended)
            except errors.ClientClosed:
                return  # the daemon ended every lease when the client closed
            if res is not None:
                first = first or next((r for r in res if isinstance(r, Exception)), None)
        if first is not None:
            raise first

    def _quietly(self, op, which=None):
        try:
            self._end(op, which)
        except errors.PegadError:
            pass  # the leases end with the connection anyway


class Reservations(_Batch):
    """Room in the pool for n blocks under write leases (alloc): write
    block i's bytes at offsets[i], then commit or abort. If the process
    dies first, the daemon gives the room back."""

    def commit(self, which=None):
        """Store the blocks of which (None: every one still held); after it
        they are immutable. [(index, created or the exception)] in order."""
        out = []
        taken = self._take(which)
        for p in range(0, len(taken), wire.MAX_BATCH):
            part = taken[p:p + wire.MAX_BATCH]
            res = self._d.call(wire.OP_COMMIT, [wire.lease_id(x) for _, x in part], decode=_decode_commit)
            out.extend(zip((i for i, _ in part), res))
        return out

    def abort(self, which=None):
        """Give the room of which (None: all) back."""
        self._end(wire.OP_ABORT, which)


class Leases(_Batch):
    """n stored blocks pinned under read leases (lease, adopt): block i's
    bytes lie at [offsets[i], +sizes[i]) of pool until release, even if the
    block is deleted or evicted meanwhile. A block whose segments are not
    back to back (fetched from a peer) is held but has no offset."""

    def prefix(self, size, lo=0, hi=None):
        """How many blocks from lo on (up to hi) have an offset and size bytes."""
        hi = len(self.offsets) if hi is None else hi
        for i in range(lo, hi):
            if self.offsets[i] is None or self.sizes[i] != size:
                return i - lo
        return hi - lo

    def fit(self, n):
        """Make the batch n blocks long: the leases past n are released,
        missing blocks padded with NotFound (an adopted pin may cover more
        or fewer blocks than the caller loads)."""
        have = len(self._ids)
        if have > n:
            self._quietly(wire.OP_RELEASE, range(n, have))
        pad = max(0, n - have)
        with self._mu:
            self._ids[n:] = [None] * pad
        self.offsets[n:] = [None] * pad
        self.sizes[n:] = [0] * pad
        self.errors[n:] = [errors.NotFound("not pinned") for _ in range(pad)]

    def release(self, which=None, quiet=False):
        """Unpin the blocks of which (None: all). Raises LeaseEnded when a
        lease had expired meanwhile (bytes read under it may be torn), or
        the connection's failure; quiet: raises nothing (blocks not read)."""
        if quiet:
            self._quietly(wire.OP_RELEASE, which)
        else:
            self._end(wire.OP_RELEASE, which)


def _check_ns(namespace):
    """The checked namespace's wire prefix (its length, then its bytes)."""
    b = _namespace(namespace)
    return wire._U16.pack(len(b)) + b


def _items(batch, hashes, suffix=b""):
    """[(index, encoded item)] of the hashes that are valid keys; each
    other one's error set in batch."""
    out = []
    for i, h in enumerate(hashes):
        if type(h) is not bytes:
            if not isinstance(h, (bytearray, memoryview)):
                batch.errors[i] = errors.WrongType(f"hash must be bytes, not {type(h).__name__}")
                continue
            h = bytes(h)
        if not 1 <= len(h) <= wire.MAX_HASH:
            batch.errors[i] = errors.InvalidArgument(f"hash of {len(h)} bytes (want 1..{wire.MAX_HASH})")
            continue
        out.append((i, bytes((len(h),)) + h + suffix))
    return out


def _send(batch, op, prefix, items, decode, place):
    """Send items (prefix + each) in frames of MAX_BATCH; place(batch, i,
    result) records each result. A broken call ends what was taken."""
    end = wire.OP_ABORT if op in (wire.OP_ALLOC, wire.OP_ALLOC_ON) else wire.OP_RELEASE
    for p in range(0, len(items), wire.MAX_BATCH):
        part = items[p:p + wire.MAX_BATCH]
        try:
            res = batch._d.call(op, [prefix + it for _, it in part], decode=decode)
        except BaseException:
            batch._quietly(end)
            raise
        for (i, _), r in zip(part, res):
            place(batch, i, r)
    _bounds(batch, end)
    return batch


def _bounds(batch, end):
    """Blocks the daemon placed outside the pool: a ProtocolError each,
    their leases ended."""
    size = batch._d.pool_size
    bad = [i for i, (off, n) in enumerate(zip(batch.offsets, batch.sizes)) if off is not None and off + n > size]
    for i in bad:
        batch.errors[i] = errors.ProtocolError(f"block at [{batch.offsets[i]},+{batch.sizes[i]}) outside "
                                               f"the pool of {size} bytes")
        batch.offsets[i] = None
    if bad:
        batch._quietly(end, bad)


def alloc(client, namespace, hashes, size, numa_node=None):
    """Room for one block of size bytes (one all-K slot) per hash, under
    namespace: a Reservations. errors[i] is Exists when the key is stored
    already, PoolFull when it does not fit. numa_node (None: any): ask for
    room on that node's part of the pool (the daemon falls back to another
    part when that one is full or absent; a daemon older than protocol
    version 4 places blocks anywhere)."""
    prefix = _check_ns(namespace)
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size < 1 << 64:
        raise errors.InvalidArgument(f"block of {size!r} bytes")
    if numa_node is not None:
        wire.check_node(numa_node)
    d = client._conn()
    op = wire.OP_ALLOC
    if numa_node is not None and numa_node != wire.NO_NODE and d.version >= 4:
        op, prefix = wire.OP_ALLOC_ON, wire.alloc_on_prefix(numa_node) + prefix
    hashes = list(hashes)
    b = Reservations(d, len(hashes))
    items = _items(b, hashes, wire._U16.pack(1) + wire._SLOT.pack(size, 0))
    return _send(b, op, prefix, items, _decode_alloc, _place_alloc)


def lease(client, namespace, hashes):
    """Read leases of the blocks hashes under namespace: a Leases.
    errors[i] is NotFound for a block not stored."""
    d = client._conn()
    prefix = _check_ns(namespace)
    hashes = list(hashes)
    b = Leases(d, len(hashes))
    return _send(b, wire.OP_LEASE, prefix, _items(b, hashes), _decode_lease, _place_lease)


def adopt(client, token):
    """Take over the pin token names (Client.lookup_pin's): its blocks as a
    Leases of this client, in chain order. NotFound: unknown, expired,
    adopted or released; Denied: another user's pin."""
    d = client._conn()
    if d.version < 3:
        raise errors.ProtocolError(f"adopt needs data protocol 3, the daemon speaks {d.version} (upgrade pegad)")
    token = getattr(token, "token", token)
    if not isinstance(token, (bytes, bytearray, memoryview)):
        raise errors.WrongType(f"token must be bytes, not {type(token).__name__}")
    (r,) = d.call(wire.OP_ADOPT, [wire.token_item(bytes(token))], decode=_decode_adopt)
    if isinstance(r, Exception):
        raise r
    b = Leases(d, len(r))
    for i, x in enumerate(r):
        _place_lease(b, i, x)
    _bounds(b, wire.OP_RELEASE)
    return b


# --- results -------------------------------------------------------------


def _place_alloc(b, i, r):
    if isinstance(r, Exception):
        b.errors[i] = r
        return
    b._ids[i], b.offsets[i], b.sizes[i] = r


def _place_lease(b, i, r):
    """r: an exception, or (lease, offset of the whole block or None, size)."""
    if isinstance(r, Exception):
        b.errors[i] = r
        return
    b._ids[i], b.offsets[i], b.sizes[i] = r


def _whole(places):
    """(first offset or None when the segments are not back to back, size)
    of one lease's slots."""
    start = nxt = None
    size = 0
    for koff, klen, voff, vlen in places:
        if klen == 0:
            raise errors.ProtocolError("lease slot without a K segment")
        for off, ln in ((koff, klen), (voff, vlen)):
            if ln == 0:
                continue
            if start is None:
                start = nxt = off
            if off != nxt:
                start = False
            nxt = off + ln
            size += ln
    return (start if start is not False else None), size


def _fixed(body, count, dt, pos=0):
    """body[pos:] as count records of dt when it is exactly that and every
    record's status (st) is ok, else None. (Record k starts at k *
    itemsize only if records 0..k-1 were ok ones of that size, so checking
    each status at those places proves the whole reply.)"""
    if len(body) - pos != count * dt.itemsize:
        return None
    a = np.frombuffer(body, dt, count, pos)
    if "st" in dt.names and a["st"].any():
        return None
    return a


def _decode_alloc(op, body, count):
    a = _fixed(body, count, _ALLOC_OK)
    if a is None:
        return wire.decode_results(op, body, count)
    return list(zip(a["lease"].tolist(), a["off"].tolist(), a["len"].tolist()))


def _one_slot(a):
    """(lease, offset, size) of records of one slot each, or None when
    some has another count of slots."""
    if (a["slots"] != 1).any():
        return None
    koff, klen, voff, vlen = (a[f].astype(np.int64) for f in ("koff", "klen", "voff", "vlen"))
    if (klen == 0).any():
        return None  # malformed: the generic decoder says so
    size = klen + vlen
    whole = (vlen == 0) | (voff == koff + klen)
    off = np.where(whole, koff, -1).tolist()
    return [(x, o if o >= 0 else None, s) for x, o, s in zip(a["lease"].tolist(), off, size.tolist())]


def _decode_lease(op, body, count):
    a = _fixed(body, count, _LEASE_OK)
    out = _one_slot(a) if a is not None else None
    if out is not None:
        return out
    return [r if isinstance(r, Exception) else (r[0], *_whole(r[1]))
            for r in wire.decode_results(op, body, count)]


def _decode_adopt(op, body, count):
    if count == 1 and len(body) >= 5 and body[0] == wire.ST_OK:
        (n,) = wire._U32.unpack_from(body, 1)
        a = _fixed(body, n, _ADOPTED, 5)
        out = _one_slot(a) if a is not None else None
        if out is not None:
            return [out]
    return [r if isinstance(r, Exception) else [(x, *_whole(places)) for x, places in r]
            for r in wire.decode_results(op, body, count)]


def _decode_commit(op, body, count):
    a = _fixed(body, count, _COMMIT_OK)
    if a is not None and not (a["created"] > 1).any():
        return a["created"].astype(bool).tolist()
    return wire.decode_results(op, body, count)


def _decode_ended(op, body, count):
    """ABORT and RELEASE: None when every item is ok, else the results."""
    if len(body) == count and body == bytes(count):
        return None
    return wire.decode_results(op, body, count)
