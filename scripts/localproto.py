#!/usr/bin/env python3
"""The e2e scripts' Python side of pegad's local data socket: the real
client package (clients/python, import name pegad), used from the source
tree so that it needs no install (the zero-copy calls import neither grpc
nor protobuf).

    localproto.py SOCKET put NS HASHHEX FILE     # alloc, write in place, commit: prints created|exists
    localproto.py SOCKET get NS HASHHEX OUT      # lease, read in place, release
    localproto.py SOCKET hold NS HASHHEX         # lease + uncommitted alloc, print "ready", sleep (to be killed)

SOCKET is pegad's --socket (the data socket is SOCKET.data).
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "clients", "python"))
import pegad  # noqa: E402


def main():
    sock, cmd, ns, h = sys.argv[1], sys.argv[2], sys.argv[3], bytes.fromhex(sys.argv[4])
    with pegad.Client(sock, timeout=30) as c:
        if cmd == "put":
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
