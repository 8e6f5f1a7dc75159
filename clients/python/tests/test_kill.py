"""A Python process killed with SIGKILL while holding a lease and an
uncommitted allocation leaves no pin and no block."""

import os
import signal
import subprocess
import sys

import pegad
from conftest import rand_hash
from harness import wait_until

HOLDER = """
import sys, time, pegad
sock, ns, h, h2 = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3]), bytes.fromhex(sys.argv[4])
c = pegad.Client(sock)
r = c.lease(ns, h)
w = c.alloc(ns, h2, 65536)
w.buffer[:] = b"u" * 65536
print("ready", flush=True)
time.sleep(600)
"""


def test_sigkill_leaves_no_pin_and_no_block(client, daemon, ns):
    h, h2 = rand_hash(), rand_hash()
    client.put(ns, h, b"r" * 8192)
    before = daemon.stats()
    p = subprocess.Popen([sys.executable, "-c", HOLDER, daemon.socket, ns, h.hex(), h2.hex()],
                         stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert p.stdout.readline().strip() == "ready"
        held = daemon.stats()
        assert held["pinned_blocks"] == before["pinned_blocks"] + 1
        assert held["pool_used"] == before["pool_used"] + 65536
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()

    def released():
        s = daemon.stats()
        return s["pinned_blocks"] == before["pinned_blocks"] and s["pool_used"] == before["pool_used"]

    wait_until("the killed client's pin and allocation to end", released)
    assert daemon.stats()["blocks"] == before["blocks"]
    try:
        client.lease(ns, h2)
        raise AssertionError("the killed client's allocation was indexed")
    except pegad.NotFound:
        pass
    # The block it had pinned is still there, unpinned.
    out = bytearray(8192)
    assert client.get(ns, h, out) == 8192
