"""The local data socket's wire format (docs/local-protocol.md, the Go
side is api/localwire): encoders and decoders of frames and items only; no
sockets, no state.
"""

import struct

from . import errors

VERSION = 4  # the newest: adds NUMA placement (the pool's parts in HELLO's reply, ALLOC_ON); 3 the lookups
MIN_VERSION = 1  # what a daemon older than RESERVE and PUT (version 2) speaks
MAX_TOKEN = 64
HEADER = struct.Struct("<IBBHI")  # len, op, status, count, seq
HEADER_LEN = HEADER.size
MAX_FRAME = 16 << 20  # most bytes after the length field
MAX_BATCH = 4096
MAX_NAMESPACE = 256
MAX_HASH = 64
MAX_SLOTS = 1024
MAX_MESSAGE = 1024
NO_NODE = -1  # an ALLOC_ON item's "any node"; a pool part bound to none
MAX_NODE = 1023  # the largest NUMA node id a daemon accepts
MAX_PARTS = 1 << 10  # most parts in a HELLO reply

OP_HELLO, OP_ALLOC, OP_COMMIT, OP_ABORT, OP_LEASE, OP_RELEASE, OP_RENEW, OP_RESERVE, OP_PUT = range(1, 10)
OP_LOOKUP, OP_LOOKUP_PIN, OP_ADOPT, OP_UNPIN, OP_LOOKUP_CLUSTER = range(10, 15)
OP_ALLOC_ON = 15  # version 4: ALLOC with a preferred NUMA node per item
OP_NAMES = {1: "hello", 2: "alloc", 3: "commit", 4: "abort", 5: "lease", 6: "release", 7: "renew",
            8: "reserve", 9: "put", 10: "lookup", 11: "lookup_pin", 12: "adopt", 13: "unpin", 14: "lookup_cluster",
            15: "alloc_on"}

ST_OK, ST_NOT_FOUND, ST_POOL_FULL, ST_INVALID, ST_EXISTS, ST_NO_LEASE, ST_LIMIT, ST_INTERNAL, ST_CLOSED, ST_DENIED = range(10)
STATUS_ERRORS = {
    ST_NOT_FOUND: errors.NotFound,
    ST_POOL_FULL: errors.PoolFull,
    ST_INVALID: errors.InvalidArgument,
    ST_EXISTS: errors.Exists,
    ST_NO_LEASE: errors.LeaseEnded,
    ST_LIMIT: errors.LimitReached,
    ST_INTERNAL: errors.InternalError,
    ST_CLOSED: errors.Unavailable,
    ST_DENIED: errors.Denied,
}

_U8 = struct.Struct("<B")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_SLOT = struct.Struct("<QQ")
_ALLOC_RES = struct.Struct("<QQQ")
_PUT_RES = struct.Struct("<BBQQQ")
_LEASE_HEAD = struct.Struct("<QH")
_PLACE = struct.Struct("<QQQQ")
HELLO_REPLY = struct.Struct("<IQQ")  # version, pool size, lease timeout (ms); then, version 4, the parts
_I32 = struct.Struct("<i")
_PART = struct.Struct("<iQQ")  # node, offset, length


def frame(op, count, seq, body):
    """One request frame: header and body."""
    if 8 + len(body) > MAX_FRAME:
        raise errors.InvalidArgument(f"{OP_NAMES[op]}: frame of {8 + len(body)} bytes (max {MAX_FRAME})")
    return HEADER.pack(8 + len(body), op, 0, count, seq) + body


def key(ns, h):
    """The encoded key; ns and h are already checked bytes."""
    return _U16.pack(len(ns)) + ns + _U8.pack(len(h)) + h


def alloc_item(ns, h, slots):
    return key(ns, h) + _U16.pack(len(slots)) + b"".join(_SLOT.pack(k, v) for k, v in slots)


def check_node(node):
    """node as an int in NO_NODE..MAX_NODE (an ALLOC_ON item's), or
    InvalidArgument."""
    if isinstance(node, bool) or not isinstance(node, int) or not NO_NODE <= node <= MAX_NODE:
        raise errors.InvalidArgument(f"NUMA node {node!r} (want {NO_NODE} for none, or 0..{MAX_NODE})")
    return node


def alloc_on_prefix(node):
    """What goes before an ALLOC item to make it an ALLOC_ON item; node
    already checked."""
    return _I32.pack(node)


def hello_reply(version, pool_size, lease_ms, parts=()):
    """A HELLO reply body (the daemon's; for tests): parts [(node, off,
    len)] from version 4."""
    b = HELLO_REPLY.pack(version, pool_size, lease_ms)
    if version >= 4:
        b += _U16.pack(len(parts)) + b"".join(_PART.pack(*p) for p in parts)
    return b


def decode_hello_reply(body):
    """(version, pool_size, lease_ms, parts) of a HELLO reply; parts
    [(node, off, len)] in address order, tiling [0, pool_size) (version 4;
    () before). ProtocolError on anything else."""
    if len(body) < HELLO_REPLY.size:
        raise errors.ProtocolError(f"hello reply of {len(body)} bytes")
    version, pool_size, lease_ms = HELLO_REPLY.unpack_from(body)
    pos, parts = HELLO_REPLY.size, ()
    if version >= 4:
        if len(body) < pos + 2:
            raise errors.ProtocolError("hello reply without its pool parts")
        (n,) = _U16.unpack_from(body, pos)
        pos += 2
        if not 0 < n <= MAX_PARTS or len(body) < pos + n * _PART.size:
            raise errors.ProtocolError(f"hello reply: {n} pool parts in {len(body) - pos} bytes")
        parts, end = [], 0
        for _ in range(n):
            node, off, ln = _PART.unpack_from(body, pos)
            pos += _PART.size
            if not NO_NODE <= node <= MAX_NODE or off != end or ln == 0 or ln > pool_size - end:
                raise errors.ProtocolError(f"hello reply: pool part on node {node} at [{off},+{ln}) "
                                           f"does not follow [0,{end}) in a pool of {pool_size}")
            parts.append((node, off, ln))
            end += ln
        if end != pool_size:
            raise errors.ProtocolError(f"hello reply: pool parts cover {end} of {pool_size} bytes")
        parts = tuple(parts)
    if pos != len(body):
        raise errors.ProtocolError(f"hello reply: {len(body) - pos} trailing bytes")
    return version, pool_size, lease_ms, parts


def lease_id(i):
    return _U64.pack(i)


reserve_item = lease_id  # a RESERVE item is one u64 size


def put_item(lease, ns, h, slots, nxt):
    """A PUT item: commit reservation lease as the block (ns, h) laid out
    as slots, and reserve nxt bytes for the next put (0: none)."""
    return _U64.pack(lease) + alloc_item(ns, h, slots) + _U64.pack(nxt)


def chain_item(ns, hashes):
    """A LOOKUP, LOOKUP_PIN or LOOKUP_CLUSTER item; ns and hashes are
    already checked bytes, at most MAX_BATCH hashes."""
    parts = [_U16.pack(len(ns)), ns, _U16.pack(len(hashes))]
    for h in hashes:
        parts.append(_U8.pack(len(h)))
        parts.append(h)
    return b"".join(parts)


def token_item(tok):
    """An ADOPT or UNPIN item."""
    if len(tok) > MAX_TOKEN:
        raise errors.InvalidArgument(f"token of {len(tok)} bytes (max {MAX_TOKEN})")
    return _U8.pack(len(tok)) + tok


def _lookup_result(op, body, pos, n):
    """The ok payload of a version-3 result at pos: (payload, new pos).
    lookup: n; lookup_pin: (n, token); adopt: [(lease, places), ...];
    lookup_cluster: (local, n, peer_id, peer_addr); unpin: None."""
    if op == OP_LOOKUP:
        return _U32.unpack_from(body, pos)[0], pos + 4
    if op == OP_LOOKUP_PIN:
        (cnt,) = _U32.unpack_from(body, pos)
        tl = body[pos + 4]
        pos += 5
        if tl > MAX_TOKEN or pos + tl > n:
            raise errors.ProtocolError(f"lookup_pin: token of {tl} bytes")
        return (cnt, bytes(body[pos:pos + tl])), pos + tl
    if op == OP_ADOPT:
        (cnt,) = _U32.unpack_from(body, pos)
        pos += 4
        if cnt > MAX_BATCH:
            raise errors.ProtocolError(f"adopt: {cnt} leases")
        leases = []
        for _ in range(cnt):
            lease, ns = _LEASE_HEAD.unpack_from(body, pos)
            pos += _LEASE_HEAD.size
            if ns == 0 or ns > MAX_SLOTS or pos + _PLACE.size * ns > n:
                raise errors.ProtocolError(f"adopt: lease of {ns} slots")
            leases.append((lease, [_PLACE.unpack_from(body, pos + _PLACE.size * j) for j in range(ns)]))
            pos += _PLACE.size * ns
        return leases, pos
    if op == OP_LOOKUP_CLUSTER:
        local, cnt = struct.unpack_from("<II", body, pos)
        pos += 8
        strs = []
        for _ in range(2):
            (ln,) = _U16.unpack_from(body, pos)
            pos += 2
            if ln > 1024 or pos + ln > n:
                raise errors.ProtocolError(f"lookup_cluster: name of {ln} bytes")
            strs.append(bytes(body[pos:pos + ln]).decode("utf-8", "replace"))
            pos += ln
        return (local, cnt, strs[0], strs[1]), pos
    return None, pos  # unpin


def item_error(op, status, msg):
    cls = STATUS_ERRORS.get(status, errors.InternalError)
    text = f"{OP_NAMES.get(op, op)}: {msg}" if msg else OP_NAMES.get(op, str(op))
    return cls(text)


def decode_results(op, body, count):
    """The count results of op's response: per item either an exception
    (a failed item) or the op's payload: alloc, alloc_on and reserve (lease, off,
    len); commit created (bool); lease (lease, [(koff, klen, voff, vlen),
    ...]); put (created, next_status, next_lease, next_off, next_len);
    None for abort, release, renew. Raises ProtocolError on malformed
    bytes."""
    out = []
    pos = 0
    n = len(body)
    try:
        for _ in range(count):
            st = body[pos]
            pos += 1
            if st != ST_OK:
                (ml,) = _U16.unpack_from(body, pos)
                pos += 2
                if ml > MAX_MESSAGE or pos + ml > n:
                    raise errors.ProtocolError(f"{OP_NAMES[op]}: message of {ml} bytes")
                out.append(item_error(op, st, bytes(body[pos:pos + ml]).decode("utf-8", "replace")))
                pos += ml
                continue
            if op in (OP_ALLOC, OP_ALLOC_ON, OP_RESERVE):
                out.append(_ALLOC_RES.unpack_from(body, pos))
                pos += _ALLOC_RES.size
            elif op == OP_PUT:
                c, nst, lease, off, ln = _PUT_RES.unpack_from(body, pos)
                pos += _PUT_RES.size
                if c > 1:
                    raise errors.ProtocolError("put: created flag not 0 or 1")
                if nst != ST_OK and (lease or off or ln):
                    raise errors.ProtocolError(f"put: next status {nst} with a next lease")
                out.append((bool(c), nst, lease, off, ln))
            elif op == OP_COMMIT:
                c = body[pos]
                pos += 1
                if c > 1:
                    raise errors.ProtocolError("commit: created flag not 0 or 1")
                out.append(bool(c))
            elif op == OP_LEASE:
                lease, ns = _LEASE_HEAD.unpack_from(body, pos)
                pos += _LEASE_HEAD.size
                if ns == 0 or ns > MAX_SLOTS or pos + _PLACE.size * ns > n:
                    raise errors.ProtocolError(f"lease: result of {ns} slots")
                places = [_PLACE.unpack_from(body, pos + _PLACE.size * j) for j in range(ns)]
                pos += _PLACE.size * ns
                out.append((lease, places))
            elif op in (OP_LOOKUP, OP_LOOKUP_PIN, OP_ADOPT, OP_UNPIN, OP_LOOKUP_CLUSTER):
                r, pos = _lookup_result(op, body, pos, n)
                out.append(r)
            elif op in (OP_ABORT, OP_RELEASE, OP_RENEW):
                out.append(None)
            else:
                raise errors.ProtocolError(f"results of op {op}")
    except (IndexError, struct.error) as e:
        raise errors.ProtocolError(f"{OP_NAMES.get(op, op)}: truncated response: {e}") from None
    if pos != n:
        raise errors.ProtocolError(f"{OP_NAMES.get(op, op)}: {n - pos} trailing bytes")
    return out
