#!/usr/bin/env python3
"""The e2e scripts' Python side of pegad's local data socket: the real
client package (clients/python, import name pegad), used from the source
tree so that it needs no install (the zero-copy calls import neither grpc
nor protobuf). It speaks the protocol's newest version, as api/localwire
does (pegad._wire.VERSION, 3), and fails when a daemon answers with an
older one.

    localproto.py SOCKET version                 # prints the version agreed (3)
    localproto.py SOCKET put NS HASHHEX FILE     # RESERVE + PUT (one round trip once warm): prints created|exists
    localproto.py SOCKET write NS HASHHEX FILE   # ALLOC, write in place, COMMIT: prints created|exists
    localproto.py SOCKET get NS HASHHEX OUT      # LEASE, read in place, RELEASE
    localproto.py SOCKET hold NS HASHHEX         # lease + uncommitted alloc, print "ready", sleep (to be killed)

SOCKET is pegad's --socket (the data socket is SOCKET.data).
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
import pegad  # noqa: E402

VERSION = pegad._wire.VERSION  # api/localwire.Version


def main():
    sock, cmd = sys.argv[1], sys.argv[2]
    with pegad.Client(sock, timeout=30) as c:
        if c.protocol_version != VERSION:
            sys.exit(f"pegad's data socket agreed version {c.protocol_version}, want {VERSION}")
        if cmd == "version":
            print(c.protocol_version)
            return
        ns, h = sys.argv[3], bytes.fromhex(sys.argv[4])
        if cmd == "put":
            with open(sys.argv[5], "rb") as f:
                print("created" if c.put(ns, h, f.read()) else "exists")
        elif cmd == "write":
            with open(sys.argv[5], "rb") as f:
                data = f.read()
            try:
                w = c.alloc(ns, h, len(data))
            except pegad.Exists:
                print("exists")
                return
            with w:
                w.buffer[:] = data
            print("created" if w.created else "exists")
        elif cmd == "get":
            with c.lease(ns, h) as r, open(sys.argv[5], "wb") as f:
                for seg in r.segments():
                    f.write(seg)
        elif cmd == "hold":
            c.lease(ns, h)
            w = c.alloc(ns, b"held-" + h, 8192)
            w.buffer[:] = b"h" * 8192
            print("ready", flush=True)
            time.sleep(60)
        else:
            sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
