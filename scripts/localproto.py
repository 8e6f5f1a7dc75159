#!/usr/bin/env python3
"""A minimal Python client of pegad's local data socket, written from
docs/local-protocol.md alone (standard library only): the check that the
document is enough for an engine in another language.

    localproto.py SOCKET.data put NS HASHHEX FILE     # alloc, write in place, commit
    localproto.py SOCKET.data get NS HASHHEX OUT      # lease, read in place, release
    localproto.py SOCKET.data hold NS HASHHEX         # lease + alloc, print "ready", sleep (to be killed)
"""
import mmap
import socket
import struct
import sys
import time

HDR = struct.Struct('<IBBHI')  # len, op, status, count, seq
HELLO, ALLOC, COMMIT, ABORT, LEASE, RELEASE, RENEW = range(1, 8)


class Client:
    def __init__(self, path):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.connect(path)
        self.seq = 0
        self.s.sendall(self.frame(HELLO, 0, struct.pack('<I', 1)))
        # The memfd rides on the reply's first byte: recvmsg before anything else.
        data, fds, _, _ = socket.recv_fds(self.s, HDR.size + 20, 1)
        self.buf = data
        op, status, count, body = self.read()
        if op != HELLO or status != 0 or not fds:
            sys.exit(f'hello refused: op {op} status {status} {body!r}')
        version, self.pool_size, self.lease_ms = struct.unpack('<IQQ', body)
        self.mem = mmap.mmap(fds[0], self.pool_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        self.view = memoryview(self.mem)
        for fd in fds:
            socket.close(fd)

    def frame(self, op, count, body):
        self.seq += 1
        return HDR.pack(8 + len(body), op, 0, count, self.seq) + body

    def recv_exact(self, n):
        while len(self.buf) < n:
            chunk = self.s.recv(65536)
            if not chunk:
                sys.exit('pegad closed the connection')
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def read(self):
        length, op, status, count, seq = HDR.unpack(self.recv_exact(HDR.size))
        return op, status, count, self.recv_exact(length - 8)

    def call(self, op, items):
        self.s.sendall(self.frame(op, len(items), b''.join(items)))
        rop, status, count, body = self.read()
        if rop != op or status != 0 or count != len(items):
            sys.exit(f'{op}: refused: status {status} {body!r}')
        return body

    @staticmethod
    def key(ns, h):
        return struct.pack('<H', len(ns)) + ns + struct.pack('<B', len(h)) + h

    @staticmethod
    def status(body, pos):
        st = body[pos]
        if st != 0:
            (n,) = struct.unpack_from('<H', body, pos + 1)
            sys.exit(f'item failed: status {st}: {body[pos + 3:pos + 3 + n].decode()}')
        return pos + 1

    def alloc(self, ns, h, size):
        """(lease, offset, length), or None when the block is stored already."""
        body = self.call(ALLOC, [self.key(ns, h) + struct.pack('<HQQ', 1, size, 0)])
        if body[0] == 4:  # exists: nothing to write
            return None
        return struct.unpack_from('<QQQ', body, self.status(body, 0))

    def commit(self, lease):
        body = self.call(COMMIT, [struct.pack('<Q', lease)])
        return body[self.status(body, 0)] == 1

    def lease(self, ns, h):
        body = self.call(LEASE, [self.key(ns, h)])
        pos = self.status(body, 0)
        lease, nslots = struct.unpack_from('<QH', body, pos)
        pos += 10
        segs = []
        for _ in range(nslots):
            koff, klen, voff, vlen = struct.unpack_from('<QQQQ', body, pos)
            pos += 32
            segs.append((koff, klen))
            if vlen:
                segs.append((voff, vlen))
        return lease, segs

    def release(self, lease):
        body = self.call(RELEASE, [struct.pack('<Q', lease)])
        self.status(body, 0)


def main():
    path, cmd, ns, h = sys.argv[1], sys.argv[2], sys.argv[3].encode(), bytes.fromhex(sys.argv[4])
    c = Client(path)
    if cmd == 'put':
        data = open(sys.argv[5], 'rb').read()
        a = c.alloc(ns, h, len(data))
        if a is None:
            print('exists')
            return
        lease, off, length = a
        c.view[off:off + length] = data
        print('created' if c.commit(lease) else 'exists')
    elif cmd == 'get':
        lease, segs = c.lease(ns, h)
        with open(sys.argv[5], 'wb') as f:
            for off, n in segs:
                f.write(c.view[off:off + n])
        c.release(lease)
    elif cmd == 'hold':
        c.lease(ns, h)
        c.alloc(ns, b'held-' + h, 8192)
        print('ready', flush=True)
        time.sleep(60)
    else:
        sys.exit(f'unknown command {cmd}')


if __name__ == '__main__':
    main()
