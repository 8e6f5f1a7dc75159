"""pegad's Python client: put, get, alloc and lease KV-cache blocks in a
local pegad's pool with no copy through the socket (the data socket,
docs/local-protocol.md), delete and prefetch over the local gRPC API.

Mirrors the Go client (client/ in the repository). It owns the client's
connections and leases; it must never copy block bytes through protobuf or
the socket on the put, get, alloc and lease paths.
"""

import concurrent.futures
import os
import time
import threading

from . import _wire as wire
from ._redial import DataLink
from . import errors
from ._handles import (
    _namespace, _hash, _slots, _bytes_view, Writer, Reader, _ids, _commit, _finish_all, _finish, Pin, Handoff,
)
from .results import AllocRequest, BlockStatus, ClusterHit, PrefetchBlock, PrefetchResult, Slot, SlotSize

__all__ = [
    "Client", "Writer", "Reader", "Slot", "SlotSize", "AllocRequest",
    "BlockStatus", "PrefetchBlock", "PrefetchResult", "DATA_SOCKET_SUFFIX", "DEFAULT_SOCKET", "Pin", "ClusterHit",
]

# Threads of a client's executor (the *_async calls). Data-socket calls
# are serialized on the connection anyway; prefetches (gRPC) overlap.
ASYNC_WORKERS = 4

# Seconds between the asks of lookup_cluster(..., wait=...): about the
# publisher's batching window (20 ms), so a wait costs a few round trips.
CLUSTER_POLL = 0.01

DATA_SOCKET_SUFFIX = ".data"
DEFAULT_SOCKET = "/run/pegad/pegad.sock"



class Client:
    """A client of the local pegad listening on socket (its --socket).

    Zero-copy calls go over the data socket (socket + ".data"); delete and
    prefetch over gRPC on socket, dialled on first use. Safe for use from
    several threads at once (a connector's scheduler, worker and save
    threads): calls on one client are serialized on its data connection,
    gRPC calls are not. The *_async calls run on the client's own threads
    and return concurrent.futures.Future. Closing it (or leaving its with
    block) ends every lease it still holds.
    """

    def __init__(self, socket=DEFAULT_SOCKET, data_socket=None, timeout=None):
        """timeout (seconds, None: none) bounds each call; a call that
        times out breaks the data connection (its leases end).

        The client outlives its connections: after the daemon restarts (or
        a call broke the data connection) the next call dials again, the
        data socket and the gRPC channel alike. A request that was sent
        when its connection broke is never sent again (the daemon may have
        applied it): that call raises Unavailable. Writers, readers and
        pins end with the connection that made them; pool then names the
        new daemon's pool (see reconnects)."""
        if not isinstance(socket, (str, os.PathLike)) or not isinstance(data_socket, (str, os.PathLike, type(None))):
            raise errors.WrongType(f"socket must be a path, not {type(socket).__name__}")
        socket = os.fspath(socket)
        data_socket = os.fspath(data_socket) if data_socket is not None else None
        self.socket = socket
        self._timeout = timeout
        self._link = DataLink(data_socket or socket + DATA_SOCKET_SUFFIX, timeout)
        self._grpc_lock = threading.Lock()  # guards _channel, _stub, _pool
        self._channel = None
        self._stub = None
        self._pool = None  # the executor of the *_async calls, made on first use

    @property
    def _data(self):
        """The data connection in use now (no I/O; possibly broken)."""
        return self._link.current

    def _conn(self):
        """The data connection for the next call: dialled again when the
        daemon closed the last one (before anything is sent on it)."""
        return self._link.get()

    @property
    def reconnects(self):
        """How many times the data connection was dialled again (a daemon
        restart): each time pool is a new mapping, to register again where
        an engine registered it (cudaHostRegister)."""
        return self._link.reconnects

    @property
    def pool_size(self):
        """Bytes of the mapped pool."""
        return self._data.pool_size

    @property
    def protocol_version(self):
        """The data socket's protocol version agreed with the daemon: 2 (put
        in one round trip) unless the daemon is older and speaks only 1."""
        return self._data.version

    @property
    def pool_parts(self):
        """The pool's NUMA parts, ((node, offset, length), ...) in address
        order (node -1: bound to none), as the daemon's HELLO told them;
        () from a daemon older than protocol version 4."""
        return self._data.parts

    @property
    def lease_timeout(self):
        """Seconds a lease lives without renew."""
        return self._data.lease_timeout

    @property
    def pool(self):
        """The whole mapped pool (memoryview), e.g. for cudaHostRegister;
        never write outside a Writer's buffer."""
        return self._data.view

    def close(self):
        """Close the connections; the daemon ends every lease still held and
        every buffer handed out becomes invalid."""
        with self._grpc_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)  # started calls finish; their futures resolve
        with self._grpc_lock:
            channel, self._channel, self._stub = self._channel, None, None
        if channel is not None:
            channel.close()
        self._link.close()
        with self._grpc_lock:
            if self._channel is not None:
                self._channel.close()
                self._channel = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    # --- zero-copy: alloc and lease ---------------------------------------

    def alloc(self, namespace, hash, size, slots=None, numa_node=None):
        """Room in the pool for a block of size bytes (shape: slots, a list
        of (k, v) sizes adding up to size; default one all-K slot) and a
        write lease on it: a Writer. Raises Exists when the key is stored
        already, PoolFull when it does not fit. numa_node: as alloc_batch's."""
        (r,) = self.alloc_batch([AllocRequest(namespace, hash, size, slots)], numa_node=numa_node)
        if isinstance(r, Exception):
            raise r
        return r

    def alloc_batch(self, requests, numa_node=None):
        """alloc of many blocks (AllocRequest or (namespace, hash, size[,
        slots]) tuples) in as few round trips as the frame limits allow.
        One result per request: a Writer, or the exception saying why not.
        numa_node (None: any part): ask for room on that NUMA node's part
        of the pool (pool_parts), where the daemon falls back to another
        part when that one is full or the pool has none there; a node id
        outside -1..1023 raises InvalidArgument, nothing sent. A daemon
        older than protocol version 4 places the blocks anywhere."""
        if numa_node is not None:
            wire.check_node(numa_node)
        out = [None] * len(requests)
        items = []
        for i, req in enumerate(requests):
            try:
                req = AllocRequest(*req)
                slots = _slots(req.size, req.slots)
                items.append((i, wire.alloc_item(_namespace(req.namespace), _hash(req.hash), slots)))
            except errors.PegadError as e:
                out[i] = e
            except TypeError as e:
                out[i] = errors.WrongType(f"alloc request {i}: {e}")
        if not items:
            return out
        d = self._conn()
        op, head = wire.OP_ALLOC, b""
        if numa_node is not None and numa_node != wire.NO_NODE and d.version >= 4:
            op, head = wire.OP_ALLOC_ON, wire.alloc_on_prefix(numa_node)
        pos = 0
        while pos < len(items):
            n, size = 0, 0
            while pos + n < len(items) and n < wire.MAX_BATCH:
                sz = len(items[pos + n][1])
                if n > 0 and size + sz > wire.MAX_FRAME // 2:
                    break
                size += sz
                n += 1
            batch = items[pos:pos + n]
            pos += n
            try:
                res = d.call(op, [head + it for _, it in batch])
            except BaseException:
                _finish_quietly(d, wire.OP_ABORT, _ids(w for w in out if isinstance(w, Writer)))
                raise
            for (i, _), r in zip(batch, res):
                if isinstance(r, Exception):
                    out[i] = r
                    continue
                lease, off, length = r
                try:
                    out[i] = Writer(d, lease, d.span(off, length, "alloc"))
                except errors.ProtocolError as e:
                    out[i] = e
                    _finish_quietly(d, wire.OP_ABORT, [lease])
        return out

    def commit_batch(self, writers):
        """Commit many writers, one round trip per 4096; raises the first
        writer's error after trying them all (each writer's created is set)."""
        errs = _commit(list(writers))
        if errs:
            raise errs[0]

    def abort_batch(self, writers):
        """Abort many writers in one round trip per 4096."""
        _finish_all(wire.OP_ABORT, list(writers))

    def lease(self, namespace, hash):
        """Pin a stored block to read it in place: a Reader. Raises NotFound
        when it is not stored."""
        (r,) = self.lease_batch(namespace, [hash])
        if isinstance(r, Exception):
            raise r
        return r

    def lease_batch(self, namespace, hashes):
        """lease of many blocks of one namespace, one round trip per 4096.
        One result per hash: a Reader, or the exception saying why not."""
        ns = _namespace(namespace)
        hashes = list(hashes)
        out = [None] * len(hashes)
        items = []
        for i, h in enumerate(hashes):
            try:
                items.append((i, wire.key(ns, _hash(h))))
            except errors.PegadError as e:
                out[i] = e
        if not items:
            return out
        d = self._conn()
        for p in range(0, len(items), wire.MAX_BATCH):
            batch = items[p:p + wire.MAX_BATCH]
            try:
                res = d.call(wire.OP_LEASE, [it for _, it in batch])
            except BaseException:
                _finish_quietly(d, wire.OP_RELEASE, _ids(r for r in out if isinstance(r, Reader)))
                raise
            for (i, _), r in zip(batch, res):
                if isinstance(r, Exception):
                    out[i] = r
                    continue
                try:
                    out[i] = self._reader(d, *r)
                except errors.ProtocolError as e:
                    out[i] = e
                    _finish_quietly(d, wire.OP_RELEASE, [r[0]])
        return out

    @staticmethod
    def _reader(d, lease, places):
        slots = []
        size = 0
        contiguous = True
        start = nxt = None
        for koff, klen, voff, vlen in places:
            segs = []
            for off, ln in ((koff, klen), (voff, vlen)):
                if ln == 0:
                    segs.append(None)
                    continue
                segs.append(d.span(off, ln, "lease segment").toreadonly())
                if start is None:
                    start = nxt = off
                if off != nxt:
                    contiguous = False
                nxt = off + ln
                size += ln
            if segs[0] is None:
                raise errors.ProtocolError("lease slot without a K segment")
            slots.append(Slot(segs[0], segs[1]))
        whole = d.view[start:start + size].toreadonly() if contiguous and size else None
        return Reader(d, lease, slots, whole, size)

    def release_batch(self, readers):
        """Release many readers, one round trip per 4096."""
        _finish_all(wire.OP_RELEASE, list(readers))

    # --- one copy: put and get --------------------------------------------

    def put(self, namespace, hash, data, slots=None):
        """Store data (bytes, bytearray, memoryview, numpy array: any
        C-contiguous buffer) as the block: one copy, into the pool. Returns
        True when stored, False when a block was already stored under the
        key (it is kept)."""
        mv = _bytes_view(data)
        ns, h, sl = _namespace(namespace), _hash(hash), _slots(mv.nbytes, slots)
        d = self._conn()
        if d.version >= 2:
            return self._put_reserved(ns, h, sl, mv, d)
        try:
            w = self.alloc(namespace, hash, mv.nbytes, slots)
        except errors.Exists:
            return False
        try:
            w.buffer[:] = mv
        except BaseException:
            _finish_quietly(w._d, wire.OP_ABORT, _ids([w]))
            raise
        return w.commit()

    def _put_reserved(self, ns, h, slots, mv, d=None):
        """put in one round trip on d (the connection for the next call):
        copy into the room the previous put reserved, then PUT commits it
        and reserves the next (RESERVE first when there is no fitting
        spare)."""
        d = d or self._conn()
        size = mv.nbytes
        if size == 0:
            raise errors.InvalidArgument("block of 0 bytes")
        sp, other, stale = d.take_spare(size)
        if stale is not None:
            _finish_quietly(d, wire.OP_ABORT, [stale[0]])  # no lease when it expired: nothing to do
        if sp is None:
            sent = time.monotonic()
            try:
                (r,) = d.call(wire.OP_RESERVE, [wire.reserve_item(size)])
                if isinstance(r, Exception):
                    raise r
            except BaseException:
                if other is not None and not d.keep_spare(other):  # a refused put changes nothing
                    _finish_quietly(d, wire.OP_ABORT, [other[0]])
                raise
            if other is not None:
                _finish_quietly(d, wire.OP_ABORT, [other[0]])
            sp = _spare_at(d, r[0], r[1], r[2], size, sent)
        try:
            sp[1][:] = mv
        except BaseException:
            _finish_quietly(d, wire.OP_ABORT, [sp[0]])
            raise
        nxt = size if d.lease_timeout > 0 else 0
        sent = time.monotonic()
        (r,) = d.call(wire.OP_PUT, [wire.put_item(sp[0], ns, h, slots, nxt)])
        if isinstance(r, errors.InvalidArgument):
            if not d.keep_spare(sp):  # refused before it was touched: still ours
                _finish_quietly(d, wire.OP_ABORT, [sp[0]])
            raise r
        if isinstance(r, Exception):
            raise r
        created, nst, lease, off, ln = r
        if nst == wire.ST_OK and lease:
            nsp = _spare_at(d, lease, off, ln, size, sent)
            if not d.keep_spare(nsp):
                _finish_quietly(d, wire.OP_ABORT, [lease])
        return created

    def put_batch(self, namespace, blocks):
        """put of many (hash, data) pairs of one namespace: one alloc and one
        commit round trip. One result per block: True (stored), False (was
        stored already) or the exception saying why not."""
        blocks = list(blocks)
        out = [None] * len(blocks)
        reqs, views, idx = [], [], []
        for i, b in enumerate(blocks):
            try:
                h, data = b
                mv = _bytes_view(data)
                reqs.append(AllocRequest(namespace, h, mv.nbytes))
                views.append(mv)
                idx.append(i)
            except errors.PegadError as e:
                out[i] = e
            except (TypeError, ValueError) as e:
                out[i] = errors.WrongType(f"block {i}: want (hash, data): {e}")
        res = self.alloc_batch(reqs)
        writers = []
        for i, mv, r in zip(idx, views, res):
            if isinstance(r, errors.Exists):
                out[i] = False
            elif isinstance(r, Exception):
                out[i] = r
            else:
                r.buffer[:] = mv
                writers.append((i, r))
        try:
            errs = _commit([w for _, w in writers])
        except BaseException:
            _abort_quietly([w for _, w in writers])
            raise
        del errs  # per writer below
        for i, w in writers:
            out[i] = w._commit_error if w._commit_error is not None else w.created
        return out

    def get(self, namespace, hash, out):
        """Copy the block's bytes (slot order) into out, a writable buffer
        (bytearray, memoryview, numpy array), and return their number: one
        copy, out of the pool. Raises ShortBuffer (with .needed) when out is
        too short, NotFound when the block is not stored."""
        dst = _bytes_view(out, writable=True)
        r = self.lease(namespace, hash)
        return self._copy_out(r, dst)

    def _copy_out(self, r, dst):
        n = r.size
        if dst.nbytes < n:
            _finish_quietly(r._d, wire.OP_RELEASE, _ids([r]))
            raise errors.ShortBuffer(f"buffer of {dst.nbytes} bytes for a block of {n}", n)
        if r.buffer is not None:
            dst[:n] = r.buffer
        else:
            off = 0
            for seg in r.segments():
                dst[off:off + seg.nbytes] = seg
                off += seg.nbytes
        # A release that finds the lease ended means it expired during the
        # copy: the memory may have been reused, so the bytes are not trusted.
        r.release()
        return n

    def get_batch(self, namespace, hashes, outs):
        """get of many blocks of one namespace into outs (one buffer per
        hash): one lease and one release round trip. One result per block:
        the bytes copied, or the exception saying why not."""
        hashes, outs = list(hashes), list(outs)
        if len(hashes) != len(outs):
            raise errors.InvalidArgument(f"{len(hashes)} hashes, {len(outs)} buffers")
        dsts = [_bytes_view(o, writable=True) for o in outs]
        res = self.lease_batch(namespace, hashes)
        result = [None] * len(res)
        readers = []
        for i, r in enumerate(res):
            if isinstance(r, Exception):
                result[i] = r
                continue
            readers.append(r)
            if dsts[i].nbytes < r.size:
                result[i] = errors.ShortBuffer(f"buffer of {dsts[i].nbytes} bytes for a block of {r.size}", r.size)
                continue
            off = 0
            for seg in r.segments():
                dsts[i][off:off + seg.nbytes] = seg
                off += seg.nbytes
            result[i] = off
        ids = _ids(readers)
        d = readers[0]._d if readers else None  # one lease_batch: one connection
        for p in range(0, len(ids), wire.MAX_BATCH):
            rel = d.call(wire.OP_RELEASE, [wire.lease_id(x) for x in ids[p:p + wire.MAX_BATCH]])
            # As in get: an ended lease means the bytes copied may be torn.
            for x, st in zip(ids[p:p + wire.MAX_BATCH], rel):
                if isinstance(st, Exception):
                    for j, r in enumerate(res):
                        if isinstance(r, Reader) and r._id == x:
                            result[j] = st
        return result

    # --- gRPC: delete and prefetch ----------------------------------------

    def _local(self):
        with self._grpc_lock:
            if self._stub is None:
                from . import _grpc
                self._channel, self._stub = _grpc.dial(self.socket)
            return self._stub

    def _grpc_call(self, fn, *args):
        """fn(stub, *args) on the gRPC channel; after Unavailable the
        channel is dropped, so the next call dials the socket afresh rather
        than wait out the old channel's reconnect backoff (a restarted
        daemon). Calls still running on it finish on it; nothing is
        resent."""
        stub = self._local()
        try:
            return fn(stub, *args)
        except errors.Unavailable:
            with self._grpc_lock:
                if self._stub is stub:
                    self._channel, self._stub = None, None
            raise

    def delete(self, namespace, hash):
        """Remove the block from the index (a pinned block's memory stays
        until its last lease ends). Returns deferred (True: it was pinned).
        Raises NotFound when it is not stored."""
        from . import _grpc
        ns = _namespace(namespace).decode("utf-8")
        h = _hash(hash)
        return self._grpc_call(_grpc.delete, ns, h, self._timeout)

    def prefetch(self, namespace, hashes, peer=None, timeout=None, handoff=None, known_peer_only=False,
                 end_handoff=False):
        """Ask the daemon to fetch blocks from peer (its gRPC host:port) into
        its pool, or, with peer None, from the nodes the cluster index says
        hold them (FailedPrecondition when the daemon has no --cluster-redis);
        timeout (seconds) bounds the fetch on the daemon's side.
        handoff: the token of the producer's Handoff (Handoff.token, or the
        str it was passed on as); the holder then ends that handoff's pin
        of each block this fetch reads. A token naming no live handoff
        changes nothing. known_peer_only: the daemon refuses (Denied,
        nothing fetched) a peer that is neither a live node of the cluster
        index nor checked by the peer port's mTLS against --peer-allow; for
        addresses from untrusted input. end_handoff (with handoff and
        peer): this prefetch is the consumer's whole pull; once it is over
        the daemon tells the holder to end the handoff, so its pins of
        blocks not read (found local, not asked for) end now, not at the
        ttl (best effort).
        Returns a PrefetchResult. On failure the exception's .result (when
        the daemon sent one) says which blocks failed and how. No hashes
        (hashes[hit.local:hit.n] with nothing missing) is a no-op: an empty
        result, nothing sent."""
        from . import _grpc
        ns = _namespace(namespace).decode("utf-8")
        hs = [_hash(h) for h in hashes]
        if peer is not None and not isinstance(peer, str):
            raise errors.WrongType(f"peer must be str, not {type(peer).__name__}")
        if isinstance(handoff, Handoff):
            handoff = handoff.token
        if handoff is not None and not isinstance(handoff, str):
            raise errors.WrongType(f"handoff must be str, not {type(handoff).__name__}")
        for name, v in (("known_peer_only", known_peer_only), ("end_handoff", end_handoff)):
            if not isinstance(v, bool):
                raise errors.WrongType(f"{name} must be bool, not {type(v).__name__}")
        if not hs:
            return PrefetchResult([], 0, 0.0, "")
        return self._grpc_call(_grpc.prefetch, ns, hs, peer or "", timeout, self._timeout,
                               handoff or "", known_peer_only, end_handoff)

    def handoff(self, namespace, hashes, ttl=30.0):
        """Pin the blocks hashes of namespace on this node for a consumer on
        another node (prefill/decode disaggregation): a Handoff, whose
        token, node_id and peer_addr the consumer's prefetch needs. Every
        block must be stored here: otherwise NotFound (the message says how
        many are missing) and nothing is pinned. ttl (seconds, default 30,
        at most 300: InvalidArgument beyond) bounds the pin when no
        consumer pulls."""
        from . import _grpc
        ns = _namespace(namespace).decode("utf-8")
        hs = [_hash(h) for h in hashes]
        if not hs:
            raise errors.InvalidArgument("handoff of no hashes")
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0:
            raise errors.InvalidArgument(f"ttl must be a positive number of seconds, not {ttl!r}")
        r = self._grpc_call(_grpc.handoff, ns, hs, ttl, self._timeout)
        return Handoff(self, r.token, r.blocks, r.node_id, r.peer_addr,
                       r.ttl.seconds + r.ttl.nanos / 1e9, r.bytes)


    # --- prefix lookups (data protocol version 3) ------------------------

    def _chain_call(self, op, namespace, hashes, d=None):
        ns = _namespace(namespace)
        hs = [_hash(h) for h in hashes]
        if len(hs) > wire.MAX_BATCH:
            raise errors.InvalidArgument(f"{len(hs)} hashes in one call (max {wire.MAX_BATCH})")
        return self._v3_call(op, wire.chain_item(ns, hs), d)

    def _v3_call(self, op, item, d=None):
        d = d or self._conn()
        if d.version < 3:
            raise errors.ProtocolError(f"{wire.OP_NAMES[op]} needs data protocol 3, the daemon speaks "
                                       f"{d.version} (upgrade pegad)")
        (r,) = d.call(op, [item])
        if isinstance(r, Exception):
            raise r
        return r

    def lookup(self, namespace, hashes):
        """The number of blocks of the chain hashes (in chain order), from
        the first, stored one after another in namespace. Pins nothing and
        changes nothing (not even LRU places): ask as often as you like.
        One round trip per 4096 hashes (the next only when the chain is
        stored that far)."""
        hashes = list(hashes)
        n = 0
        while True:
            chunk = hashes[n:n + wire.MAX_BATCH]
            got = self._chain_call(wire.OP_LOOKUP, namespace, chunk)
            if got > len(chunk):
                raise errors.ProtocolError(f"lookup of {len(chunk)} hashes answered {got}")
            n += got
            if got < len(chunk) or n == len(hashes):
                return n

    def lookup_ranks(self, base, tp, hashes):
        """The prefix every one of tp tensor-parallel ranks can load: the
        minimum over ranks r of lookup(f"{base}@tp{r}", hashes) (one round
        trip per rank; stops early at 0). docs/local-protocol.md "Tensor
        parallel"."""
        if not isinstance(tp, int) or tp < 1:
            raise errors.InvalidArgument(f"tp must be a positive int, not {tp!r}")
        base = _namespace(base).decode("utf-8")
        hashes = list(hashes)
        n = len(hashes)
        for r in range(tp):
            if n == 0:
                break
            n = min(n, self.lookup(f"{base}@tp{r}", hashes[:n]))
        return n

    def lookup_pin(self, namespace, hashes):
        """lookup of up to 4096 hashes that also pins the stored prefix
        under a token another client of this user (a worker process) can
        adopt: a Pin. Unadopted, it ends at the lease timeout or on
        release. Pin.n may be less than lookup's answer when the blocks'
        places would not fit one ADOPT answer (16 MiB)."""
        d = self._conn()
        n, tok = self._chain_call(wire.OP_LOOKUP_PIN, namespace, list(hashes), d)
        return Pin(d, n, tok)

    def adopt(self, token):
        """Take over the pin token names: its blocks become Readers of this
        client, in chain order, ended by release, by this client's close or
        by its process's death. NotFound: unknown, expired, adopted or
        released; Denied: another user's pin. On an error nothing changes."""
        if isinstance(token, Pin):
            token = token.token
        if not isinstance(token, (bytes, bytearray, memoryview)):
            raise errors.WrongType(f"token must be bytes, not {type(token).__name__}")
        d = self._conn()
        leases = self._v3_call(wire.OP_ADOPT, wire.token_item(bytes(token)), d)
        out = []
        try:
            for lease, places in leases:
                out.append(self._reader(d, lease, places))
        except errors.ProtocolError:
            _finish_quietly(d, wire.OP_RELEASE, [lease for lease, _ in leases])
            raise
        return out

    def lookup_cluster(self, namespace, hashes, wait=0.0):
        """The stored prefix of the chain (up to 4096 hashes) here, and the
        other node the cluster index says holds the longest prefix: a
        ClusterHit. InvalidArgument when the daemon has no --cluster-redis.

        The index lags the nodes (docs/cluster.md, "Index lag": a block put
        on another node is listed some 20-50 ms later). wait (seconds) bounds
        how long to ask again, every CLUSTER_POLL seconds, while no other
        node is listed holding more of the chain than this one (hit.n <=
        hit.local, the chain not all here); the last answer is returned
        either way. 0: one round trip."""
        if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait < 0:
            raise errors.InvalidArgument(f"wait must be seconds >= 0, not {wait!r}")
        hashes = list(hashes)
        deadline = time.monotonic() + wait
        while True:
            local, n, peer_id, peer = self._chain_call(wire.OP_LOOKUP_CLUSTER, namespace, hashes)
            hit = ClusterHit(peer or None, n, local, peer_id)
            left = deadline - time.monotonic()
            if n > local or local >= len(hashes) or left <= 0:
                return hit
            time.sleep(min(CLUSTER_POLL, left))

    # --- asynchronous calls -------------------------------------------------

    def _submit(self, fn, *args):
        with self._grpc_lock:
            if self._link.closed:
                raise errors.ClientClosed("pegad client closed")
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(ASYNC_WORKERS, thread_name_prefix="pegad")
            return self._pool.submit(fn, *args)

    def prefetch_async(self, namespace, hashes, peer=None, timeout=None, handoff=None, known_peer_only=False):
        """prefetch without blocking: a concurrent.futures.Future of its
        PrefetchResult (.done(), .result(timeout))."""
        return self._submit(self.prefetch, namespace, list(hashes), peer, timeout, handoff, known_peer_only)

    def get_batch_async(self, namespace, hashes, outs):
        """get_batch without blocking: a Future of its results. outs must
        stay untouched until it is done."""
        return self._submit(self.get_batch, namespace, list(hashes), list(outs))

    def put_batch_async(self, namespace, blocks):
        """put_batch without blocking: a Future of its results. The
        blocks' buffers must stay untouched until it is done."""
        return self._submit(self.put_batch, namespace, list(blocks))


def _spare_at(d, lease, off, ln, size, sent):
    """The spare (lease, view, sent) of a reservation the daemon made on d;
    one of the wrong size or outside the pool is aborted."""
    try:
        if ln != size:
            raise errors.ProtocolError(f"reservation of {ln} bytes, asked for {size}")
        return (lease, d.span(off, ln, "reservation"), sent)
    except errors.ProtocolError:
        _finish_quietly(d, wire.OP_ABORT, [lease])
        raise


def _abort_quietly(writers):
    try:
        _finish_all(wire.OP_ABORT, writers)
    except errors.PegadError:
        pass


def _finish_quietly(d, op, ids):
    if not ids:
        return
    try:
        _finish(d, op, ids)
    except errors.PegadError:
        pass
