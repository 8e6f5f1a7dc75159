"""The client's handles and argument checks: a Writer of reserved slots, a
Reader of leased ones, a Pin of a stored prefix, a Handoff for a P/D
consumer, and the checks every Client call makes of its arguments.

It owns no connection: each handle holds the data connection that made it
(a restarted daemon reuses lease ids, so a handle never follows a redial)
and every call goes through that connection.
"""

import threading

from . import _wire as wire
from . import errors
from .results import SlotSize

def _namespace(ns):
    if not isinstance(ns, str):
        raise errors.WrongType(f"namespace must be str, not {type(ns).__name__}")
    b = ns.encode("utf-8")
    if not 1 <= len(b) <= wire.MAX_NAMESPACE:
        raise errors.InvalidArgument(f"namespace of {len(b)} bytes (want 1..{wire.MAX_NAMESPACE})")
    return b


def _hash(h):
    if not isinstance(h, (bytes, bytearray, memoryview)):
        raise errors.WrongType(f"hash must be bytes, not {type(h).__name__}")
    b = bytes(h)
    if not 1 <= len(b) <= wire.MAX_HASH:
        raise errors.InvalidArgument(f"hash of {len(b)} bytes (want 1..{wire.MAX_HASH})")
    return b


def _size(n, what="size"):
    if isinstance(n, bool) or not isinstance(n, int):
        raise errors.WrongType(f"{what} must be int, not {type(n).__name__}")
    if n < 0 or n >= 1 << 64:
        raise errors.InvalidArgument(f"{what} of {n} bytes")
    return n


def _slots(size, slots):
    """The slot layout: one all-K slot of size when slots is None."""
    if slots is None:
        size = _size(size)
        if size == 0:
            raise errors.InvalidArgument("block of 0 bytes")
        return [(size, 0)]
    try:
        out = [(_size(k, "K size"), _size(v, "V size")) for k, v in (SlotSize(*s) if not isinstance(s, SlotSize) else s for s in slots)]
    except TypeError as e:
        raise errors.WrongType(f"slots must be (k, v) pairs: {e}") from None
    if not 1 <= len(out) <= wire.MAX_SLOTS:
        raise errors.InvalidArgument(f"{len(out)} slots (want 1..{wire.MAX_SLOTS})")
    total = sum(k + v for k, v in out)
    if size is not None and total != size:
        raise errors.InvalidArgument(f"slots add up to {total} bytes, the block is {size}")
    return out


def _bytes_view(data, writable=False):
    """data as a flat memoryview of bytes (no copy)."""
    try:
        mv = memoryview(data)
    except TypeError:
        raise errors.WrongType(f"{type(data).__name__} is not a buffer (want bytes, bytearray, memoryview, numpy array)") from None
    if writable and mv.readonly:
        raise errors.WrongType(f"{type(data).__name__} is read-only: get needs a writable buffer")
    if not mv.c_contiguous:
        raise errors.InvalidArgument("buffer is not C-contiguous")
    if mv.format != "B" or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


def _drop(mv):
    """Invalidate a view handed to the caller, where nothing else exports it
    (a numpy array made from it keeps it alive; that one must not be used)."""
    try:
        mv.release()
    except BufferError:
        pass


class _Once:
    """Ends exactly once: _take is true for the first caller only (commit,
    abort, release, or the client's close, whichever comes first)."""

    def __init__(self):
        self._mu = threading.Lock()  # guards _done (and a subclass's fields it names)
        self._done = False

    def _take(self):
        with self._mu:
            if self._done:
                return False
            self._done = True
            return True


class Writer(_Once):
    """Room in the pool for one block, under a write lease.

    Write the block's bytes (slot order: slot 0 K, slot 0 V, slot 1 K, ...)
    into buffer, then commit to store it or abort to give the room back.
    As a context manager: commit on a clean exit, abort on an exception.
    If the process dies first, the daemon gives the room back.
    """

    def __init__(self, conn, lease, view):
        self._d = conn
        self._id = lease
        self.buffer = view  # writable memoryview into the pool, released at commit/abort
        super().__init__()  # self._mu also guards created
        self.created = False  # after commit: stored by this writer (False: someone else's copy won)
        self._commit_error = None

    @property
    def pool(self):
        """The mapped pool buffer lies in (the client's pool when the lease
        was taken; a daemon restart since gives the client a new one)."""
        return self._d.view

    def commit(self):
        """Index the block; after it the block is immutable. Returns
        created (False: the key was stored by someone else first)."""
        errs = _commit([self])
        if errs:
            raise errs[0]
        return self.created

    def abort(self):
        """Give the room back. After commit or abort it does nothing."""
        _finish_all(wire.OP_ABORT, [self])

    def renew(self):
        """Push the lease's deadline back by the lease timeout."""
        _renew(self._d, self._id)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            if not self._done:
                self.commit()
        else:
            try:
                self.abort()
            except errors.PegadError:
                pass  # the original exception matters more
        return False


class Reader(_Once):
    """A stored block pinned under a read lease: read it in place, then
    release (or use it as a context manager).

    buffer is the whole block (slot order), a read-only memoryview into the
    pool, when its segments lie back to back (as a put's do); None when the
    block is scattered (fetched from a peer): then use slots. The memory
    stays the block's until release, even if it is deleted or evicted.
    """

    def __init__(self, conn, lease, slots, whole, size):
        self._d = conn
        self._id = lease
        self.slots = slots
        self.buffer = whole
        self.size = size
        super().__init__()

    def release(self):
        """Unpin the block. Raises LeaseEnded when the lease had expired
        meanwhile: bytes read under it may be torn. Later calls do nothing."""
        _finish_all(wire.OP_RELEASE, [self])

    @property
    def pool(self):
        """The mapped pool the block's views lie in (see Writer.pool)."""
        return self._d.view

    def renew(self):
        """Push the lease's deadline back by the lease timeout."""
        _renew(self._d, self._id)

    def segments(self):
        """The block's segments in slot order (K, V, K, V, ...)."""
        for s in self.slots:
            yield s.k
            if s.v is not None:
                yield s.v

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.release()
        except errors.PegadError:
            if exc_type is None:
                raise
        return False


def _ids(objs):
    """Ids of the writers or readers not finished yet, marking them finished
    and invalidating the views handed out."""
    ids = []
    for o in objs:
        if o is not None and o._take():
            ids.append(o._id)
            _release_views(o)
    return ids


def _release_views(o):
    if isinstance(o, Writer):
        _drop(o.buffer)
    else:
        if o.buffer is not None:
            _drop(o.buffer)
        for s in o.slots:
            _drop(s.k)
            if s.v is not None:
                _drop(s.v)


def _by_conn(objs):
    """objs grouped by the connection that holds their leases, in order: a
    lease id is sent only on its own connection (after a reconnect an old
    id may name another lease on the new one)."""
    groups = {}
    for o in objs:
        groups.setdefault(o._d, []).append(o)
    return groups.items()


def _commit(writers):
    """Commit the writers not finished; a list of the per-writer errors."""
    live = [w for w in writers if w is not None and w._take()]
    for w in live:
        _drop(w.buffer)
    errs = []
    for d, group in _by_conn(live):
        errs.extend(_commit_on(d, group))
    return errs


def _commit_on(d, live):
    errs = []
    for i in range(0, len(live), wire.MAX_BATCH):
        batch = live[i:i + wire.MAX_BATCH]
        res = d.call(wire.OP_COMMIT, [wire.lease_id(w._id) for w in batch])
        for w, r in zip(batch, res):
            if isinstance(r, Exception):
                w._commit_error = r
                errs.append(r)
            else:
                w.created = r
    return errs


def _finish_all(op, objs):
    """ABORT or RELEASE the writers or readers not finished yet, each on its
    own connection; raises the first item error after trying them all."""
    live = [o for o in objs if o is not None and o._take()]
    for o in live:
        _release_views(o)
    first = None
    for d, group in _by_conn(live):
        try:
            _finish(d, op, [o._id for o in group])
        except errors.PegadError as e:
            first = first or e
    if first is not None:
        raise first


def _finish(d, op, ids):
    """ABORT or RELEASE ids; raises the first item error."""
    errs = []
    for i in range(0, len(ids), wire.MAX_BATCH):
        try:
            res = d.call(op, [wire.lease_id(x) for x in ids[i:i + wire.MAX_BATCH]])
        except errors.ClientClosed:
            return  # the daemon ended every lease when the client closed
        errs.extend(r for r in res if isinstance(r, Exception))
    if errs:
        raise errs[0]


def _renew(d, lease):
    (r,) = d.call(wire.OP_RENEW, [wire.lease_id(lease)])
    if isinstance(r, Exception):
        raise r


class Pin:
    """A pinned stored prefix (lookup_pin): its first n blocks stay in the
    pool until a client of the same user adopts token (Client.adopt), the
    pin is released, or the daemon's lease timeout passes. As a context
    manager it is released on exit unless adopted meanwhile."""

    def __init__(self, conn, n, token):
        self._d = conn
        self.n = n
        self.token = token

    def release(self):
        """Drop the pin at once; NotFound when it was adopted, released or
        expired already."""
        (r,) = self._d.call(wire.OP_UNPIN, [wire.token_item(self.token)])
        if isinstance(r, Exception):
            raise r

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.release()
        except errors.NotFound:
            pass  # adopted (or expired): nothing left to drop
        return False

    def __repr__(self):
        return f"Pin(n={self.n}, token={self.token.hex()})"


class Handoff:
    """A prefill/decode handoff (Client.handoff): n blocks pinned on this
    node for a consumer on another node, who pulls them with
    Client.prefetch(..., peer=peer_addr, handoff=token). The pin ends when
    that pull has read every block, when ttl (seconds) passes, or on
    release(). token is opaque; pass it on as is."""

    def __init__(self, client, token, n, node_id, peer_addr, ttl, nbytes):
        self._client = client
        self.token = token
        self.n = n
        self.node_id = node_id
        self.peer_addr = peer_addr
        self.ttl = ttl
        self.bytes = nbytes

    def release(self):
        """End the handoff now. Idempotent: True when this call ended it,
        False when it had ended already (pulled, expired or released)."""
        from . import _grpc
        return self._client._grpc_call(_grpc.release_handoff, self.token, self._client._timeout)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.release()
        return False

    def __repr__(self):
        return f"Handoff(n={self.n}, node_id={self.node_id!r}, peer_addr={self.peer_addr!r}, ttl={self.ttl})"
