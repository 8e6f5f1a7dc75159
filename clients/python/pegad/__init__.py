"""pegad: the Python client of a local pegad daemon.

    import pegad
    with pegad.Client(socket="/run/pegad/pegad.sock") as c:
        c.put("llama-70b", b"\\xab\\xcd", data)           # one copy in
        n = c.get("llama-70b", b"\\xab\\xcd", out)         # one copy out
        with c.alloc("llama-70b", h, size) as w:          # write in place
            w.buffer[:] = ...
        with c.lease("llama-70b", h) as r:                # read in place
            arr = numpy.frombuffer(r.buffer, dtype=numpy.float16)

See clients/python/README.md and docs/local-protocol.md.
"""

from .client import (DATA_SOCKET_SUFFIX, DEFAULT_SOCKET, AllocRequest, BlockStatus, Client, ClusterHit, Handoff, Pin,
                     PrefetchBlock,
                     PrefetchResult, Reader, Slot, SlotSize, Writer)
from .errors import (Aborted, ClientClosed, Denied, Exists, FailedPrecondition, InternalError, InvalidArgument, LeaseEnded,
                     LimitReached, NotFound, PegadError, PoolFull, ProtocolError, ShortBuffer,
                     Unavailable, WrongType)

__version__ = "0.1.0"

__all__ = [
    "Client", "Writer", "Reader", "Slot", "SlotSize", "AllocRequest", "BlockStatus", "PrefetchBlock", "Pin",
    "ClusterHit", "Denied", "Handoff",
    "PrefetchResult", "DATA_SOCKET_SUFFIX", "DEFAULT_SOCKET",
    "PegadError", "NotFound", "PoolFull", "InvalidArgument", "WrongType", "Exists",
    "LeaseEnded", "LimitReached", "Unavailable", "ClientClosed", "ProtocolError",
    "InternalError", "ShortBuffer", "Aborted", "FailedPrecondition",
]
