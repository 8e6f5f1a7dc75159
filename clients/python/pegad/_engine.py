"""What both engine connectors need from the daemon beyond single calls: a
client that survives the daemon going away (the engine recomputes meanwhile
and reconnects later), and the prefix lookup over every rank's namespace.

It owns the connectors' Client and when it is re-dialled; it must never
raise a daemon failure into the engine: every failure becomes "nothing
cached" (lookup 0, load errors, saves dropped) and is counted.
"""

import logging
import threading
import time

from . import errors
from .client import Client

log = logging.getLogger("pegad.engine")

# The daemon's failures the connectors turn into recompute: its errors and a
# socket that is gone (a stopped daemon).
FAILURES = (errors.PegadError, OSError)


class Link:
    """A lazily dialled Client of the local pegad, dropped on the first
    failure and dialled again at most every retry seconds. Thread-safe."""

    def __init__(self, socket, timeout=5.0, retry=1.0):
        self.socket = socket
        self.timeout = timeout
        self.retry = retry
        self._mu = threading.Lock()  # guards _client, _next_dial, failures
        self._client = None
        self._next_dial = 0.0
        self.failures = 0  # daemon failures seen (each one meant recompute)

    def get(self):
        """The client, or None while the daemon is unreachable."""
        with self._mu:
            if self._client is not None:
                return self._client
            now = time.monotonic()
            if now < self._next_dial:
                return None
            try:
                self._client = Client(self.socket, timeout=self.timeout)
            except FAILURES as e:
                self._next_dial = now + self.retry
                self.failures += 1
                log.warning("pegad unreachable, the engine recomputes: %s", e)
                return None
            return self._client

    def failed(self, client, err):
        """Drop client after err (a later get dials again)."""
        with self._mu:
            self.failures += 1
            if self._client is client and client is not None:
                self._client = None
                self._next_dial = time.monotonic() + self.retry
                log.warning("pegad call failed, the engine recomputes: %s", err)
                try:
                    client.close()
                except FAILURES:
                    pass

    def close(self):
        with self._mu:
            c, self._client = self._client, None
        if c is not None:
            c.close()


def lookup(client, namespace, hashes):
    """Consecutive blocks of hashes stored under namespace, from the start.
    Uses the daemon's side-effect-free LOOKUP (Client.lookup); against a
    daemon without it (protocol v2) it leases and releases at once, which
    touches the blocks' LRU but pins nothing beyond the call."""
    if not hashes:
        return 0
    if hasattr(client, "lookup"):
        return client.lookup(namespace, hashes)
    res = client.lease_batch(namespace, hashes)
    n = next((i for i, r in enumerate(res) if isinstance(r, Exception)), len(res))
    client.release_batch([r for r in res if not isinstance(r, Exception)])
    return n


def prefix(client, namespaces, hashes):
    """The prefix every namespace (one per rank) holds: the minimum, so no
    rank is ever told to load a block it cannot find."""
    n = len(hashes)
    for ns in namespaces:
        if n == 0:
            break
        n = min(n, lookup(client, ns, hashes[:n]))
    return n


def as_numpy(t):
    """An engine buffer (numpy array or CPU torch tensor) as a numpy array
    over the same memory (no copy); 16-bit floats come as int16: the
    connectors move bytes, never values."""
    import numpy as np
    if isinstance(t, np.ndarray):
        return t
    if getattr(t, "is_cuda", False):
        raise TypeError("pegad's connectors copy with numpy: CUDA buffers are not supported yet")
    import torch  # only reached with torch tensors
    if t.dtype in (torch.bfloat16, torch.float16):
        t = t.view(torch.int16)
    elif t.dtype.is_floating_point and t.element_size() == 1:
        t = t.view(torch.uint8)
    return t.numpy()
