"""The connection to pegad's data socket and this process's mapping of the
pool (docs/local-protocol.md). It owns the socket, the mmap and the request
lock; it must never copy block bytes through the socket.
"""

import mmap
import select
import socket
import threading
import time

from . import _wire as wire
from . import errors


# Seconds close waits for the daemon to take the spare back (ABORT) before
# it closes the connection, which ends the spare anyway.
CLOSE_ABORT_TIMEOUT = 1.0


class _RefusedHello(errors.ProtocolError):
    """The daemon refused HELLO (one older than this client refuses its
    newest version)."""


class DataConn:
    """One data-socket connection: one request in flight at a time."""

    def __init__(self, path, timeout=None):
        # A daemon older than this client refuses its newest version:
        # step down one version at a time (a version-2 daemon keeps PUT).
        refused = None
        for version in range(wire.VERSION, wire.MIN_VERSION - 1, -1):
            try:
                self._open(path, timeout, version)
                return
            except _RefusedHello as e:
                refused = refused or e
            except errors.Unavailable:
                if refused is None:
                    raise
                raise refused from None
        raise refused

    def _open(self, path, timeout, version):
        self._lock = threading.Lock()  # guards the socket, seq, buffers, broken, closed
        self._seq = 0
        self._broken = None
        self._closed = False
        self._rbuf = bytearray(64 << 10)  # read buffer: [_rstart, _rend) not consumed yet
        self._rmv = memoryview(self._rbuf)
        self._rstart = self._rend = 0
        self._spare_lock = threading.Lock()  # guards _spare
        self._spare = None  # (lease, view, sent): room reserved for the next put
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        except OSError as e:
            raise errors.Unavailable(f"data socket {path}: {e}") from e
        try:
            s.settimeout(timeout if timeout is not None else 10.0)
            s.connect(path)
        except OSError as e:
            s.close()
            raise errors.Unavailable(f"data socket {path}: {e}") from e
        self._sock = s
        try:
            self._hello(version)
        except BaseException:
            s.close()
            raise
        s.settimeout(timeout)

    def _hello(self, version):
        self._seq += 1
        self._sock.sendall(wire.frame(wire.OP_HELLO, 0, self._seq, wire._U32.pack(version)))
        # The fd rides on the reply's first byte: recvmsg before anything
        # else reads the stream.
        try:
            data, fds, _, _ = socket.recv_fds(self._sock, wire.HEADER_LEN + 64, 1)
        except OSError as e:
            raise errors.Unavailable(f"hello: {e}") from e
        try:
            self._rbuf[:len(data)] = data
            self._rend = len(data)
            if not data:
                raise errors.Unavailable("hello: the daemon closed the connection")
            op, status, count, seq, body = self._read_frame()
            if status != wire.ST_OK:
                raise _RefusedHello(f"daemon refused hello (version {version}): "
                                    f"{bytes(body).decode('utf-8', 'replace')}")
            if op != wire.OP_HELLO:
                raise errors.ProtocolError(f"hello answered with op {op}, {len(body)} bytes")
            got, pool_size, lease_ms, parts = wire.decode_hello_reply(body)
            if got != version:
                raise errors.ProtocolError(f"hello answered with version {got}, asked {version}")
            if not fds:
                raise errors.ProtocolError("hello carried no memfd")
            if pool_size == 0:
                raise errors.ProtocolError("pool of 0 bytes")
            self.mm = mmap.mmap(fds[0], pool_size, flags=mmap.MAP_SHARED,
                                prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            for fd in fds:
                socket.close(fd)  # the mapping keeps the memory
        self.view = memoryview(self.mm)
        self.version = version
        self.pool_size = pool_size
        self.parts = parts  # ((node, off, len), ...): the pool's NUMA parts (version 4; () before)
        self.lease_timeout = lease_ms / 1000.0

    def _recv_exact(self, n):
        """The next n bytes of the stream, as a memoryview valid until the
        next read. Reads as much as the socket has (a whole response is
        usually one recv), keeping the rest for the next call."""
        avail = self._rend - self._rstart
        if avail < n:
            if self._rstart + n > len(self._rbuf):
                if n > len(self._rbuf):
                    buf = bytearray(max(n, 2 * len(self._rbuf)))  # the old views stay valid on the old one
                    buf[:avail] = self._rbuf[self._rstart:self._rend]
                    self._rbuf, self._rmv = buf, memoryview(buf)
                else:
                    self._rbuf[:avail] = self._rbuf[self._rstart:self._rend]
                self._rstart, self._rend = 0, avail
            while self._rend - self._rstart < n:
                k = self._sock.recv_into(self._rmv[self._rend:])
                if k == 0:
                    raise errors.Unavailable("the daemon closed the data connection")
                self._rend += k
        out = self._rmv[self._rstart:self._rstart + n]
        self._rstart += n
        if self._rstart == self._rend:
            self._rstart = self._rend = 0
        return out

    def _read_frame(self):
        length, op, status, count, seq = wire.HEADER.unpack(self._recv_exact(wire.HEADER_LEN))
        if length < 8 or length > wire.MAX_FRAME or count > wire.MAX_BATCH:
            raise errors.ProtocolError(f"frame of {length} bytes, {count} items")
        return op, status, count, seq, self._recv_exact(length - 8)

    def call(self, op, items, timeout=None, decode=wire.decode_results):
        """Send one request of items (encoded bytes each) and return the
        results as decode(op, body, count) makes them (the body is valid
        only during the call). A failure of the connection itself breaks it for
        good (the daemon then ends its leases). timeout (seconds) bounds
        the wait for the connection and each read of this call, for the
        connection's last call (close's ABORT): it stays on the socket."""
        body = items[0] if len(items) == 1 else b"".join(items)
        if not self._lock.acquire(timeout=-1 if timeout is None else timeout):
            raise errors.Unavailable(f"{wire.OP_NAMES[op]}: the connection stayed busy for {timeout} s")
        try:
            if self._closed:
                raise errors.ClientClosed("pegad client closed")
            if self._broken is not None:
                raise errors.Unavailable(f"data connection broken by an earlier failure: {self._broken}")
            if timeout is not None:
                self._sock.settimeout(timeout)
            self._seq = (self._seq + 1) & 0xFFFFFFFF
            req = wire.frame(op, len(items), self._seq, body)  # InvalidArgument: nothing sent
            try:
                self._sock.sendall(req)
                rop, status, count, seq, rbody = self._read_frame()
                if status != wire.ST_OK:
                    raise errors.ProtocolError(
                        f"daemon refused {wire.OP_NAMES[op]}: status {status}: "
                        f"{bytes(rbody).decode('utf-8', 'replace')}")
                if rop != op or seq != self._seq or count != len(items):
                    raise errors.ProtocolError(
                        f"answer op {rop} seq {seq} count {count} to op {op} seq {self._seq} count {len(items)}")
                return decode(op, rbody, count)
            except BaseException as e:
                # Also on KeyboardInterrupt: a response may be left half
                # read, so the stream cannot be trusted any more.
                self._broken = e
                self._sock.close()
                if isinstance(e, OSError):
                    raise errors.Unavailable(f"{wire.OP_NAMES[op]}: {e}") from e
                raise
        finally:
            self._lock.release()

    def alive(self) -> bool:
        """Whether a call could be sent now: not closed, not broken, and not
        closed by the daemon meanwhile (a restarted or stopped daemon). Only
        answers, never reads: between calls the daemon sends nothing, so a
        socket that is readable then has been closed by it (or sent bytes
        no request asked for): the connection is marked broken without
        sending anything. Waits for a call in flight on another thread."""
        with self._lock:
            if self._closed or self._broken is not None:
                return False
            p = select.poll()
            p.register(self._sock, select.POLLIN | select.POLLPRI)
            if not p.poll(0) and self._rstart == self._rend:
                return True
            self._broken = errors.Unavailable("the daemon closed the data connection")
            self._sock.close()
            return False

    def retire(self) -> None:
        """Stop using a broken connection (the client dialled a new one):
        its socket is closed and every later call on it raises Unavailable.
        The mapping stays while the leases' views of it are referenced (a
        mapping is freed when its last view is), so a view an engine still
        holds never points at unmapped memory."""
        with self._spare_lock:
            self._spare = None
        with self._lock:
            if self._broken is None:
                self._broken = errors.Unavailable("replaced by a new connection")
            self._sock.close()

    def span(self, off, ln, what):
        """The pool's view of [off, off+ln), which the daemon named for
        what; ProtocolError when that lies outside the pool."""
        if off > self.pool_size or ln > self.pool_size - off:
            raise errors.ProtocolError(f"{what} at [{off},+{ln}) outside the pool of {self.pool_size} bytes")
        return self.view[off:off + ln]

    def take_spare(self, size):
        """The room reserved for the next put, as (fits, other, stale): fits
        when it is of size bytes and younger than half the lease timeout
        (so never written after the daemon could have expired it); other
        when young but of another size (kept if a new reservation fails,
        aborted otherwise); stale when too old (to abort)."""
        with self._spare_lock:
            sp, self._spare = self._spare, None
        if sp is None:
            return None, None, None
        if time.monotonic() - sp[2] >= self.lease_timeout / 2:
            return None, None, sp
        if len(sp[1]) != size:
            return None, sp, None
        return sp, None, None

    def keep_spare(self, sp):
        """Make sp the spare; False when one is there already (the caller
        aborts sp)."""
        with self._spare_lock:
            if self._spare is not None or self._closed or self._broken is not None:
                return False
            self._spare = sp
            return True

    def close(self):
        """Close the connection (the daemon ends its leases) and unmap the
        pool; views still exported keep the mapping alive until freed. The
        spare is given back first, so that the daemon no longer counts it
        when close returns."""
        with self._spare_lock:
            sp, self._spare = self._spare, None
        if sp is not None:
            try:
                # Bounded as the Go client's: a stopped or wedged daemon
                # must not hold close (nor a with block's end) for ever.
                self.call(wire.OP_ABORT, [wire.lease_id(sp[0])], timeout=CLOSE_ABORT_TIMEOUT)
            except errors.PegadError:
                pass  # the close below ends it anyway
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._spare = None  # one a put kept meanwhile: ended with the connection
            self._sock.close()
            try:
                self.view.release()
                self.mm.close()
            except BufferError:
                pass  # a caller still holds a view: the mapping goes when it is freed
