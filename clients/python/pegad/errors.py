"""Typed exceptions of the pegad client.

Every error the client raises is a PegadError; callers branch on the
subclasses (the Python form of the Go client's errors.Is sentinels).
"""

__all__ = [
    "PegadError", "NotFound", "PoolFull", "InvalidArgument", "WrongType", "Exists",
    "LeaseEnded", "LimitReached", "Unavailable", "ClientClosed", "ProtocolError",
    "InternalError", "ShortBuffer", "Aborted", "FailedPrecondition", "Denied",
]


class PegadError(Exception):
    """Base of every error of this package."""


class NotFound(PegadError, KeyError):
    """No such block."""

    def __str__(self):  # KeyError would quote the message
        return Exception.__str__(self)


class PoolFull(PegadError):
    """The block does not fit even after evicting every unpinned block."""


class InvalidArgument(PegadError, ValueError):
    """Bad key, sizes or request; nothing was changed."""


class WrongType(InvalidArgument, TypeError):
    """An argument of the wrong type (also a TypeError); nothing was changed."""


class Exists(PegadError):
    """alloc of a key already stored: nothing to write."""


class LeaseEnded(PegadError):
    """The lease ended (released, committed, aborted, expired, or its connection closed)."""


class LimitReached(PegadError):
    """Per-connection lease limit or response size reached."""


class Unavailable(PegadError, ConnectionError):
    """The daemon cannot be reached, is shutting down, or the connection broke."""


class ClientClosed(PegadError):
    """The client was closed."""


class ProtocolError(PegadError):
    """The daemon answered something this client does not understand."""


class InternalError(PegadError):
    """The daemon failed internally."""


class ShortBuffer(PegadError, ValueError):
    """get's buffer is shorter than the block; nothing was copied.

    needed is the block's size.
    """

    def __init__(self, msg, needed):
        super().__init__(msg)
        self.needed = needed


class Denied(PegadError, PermissionError):
    """A pin token of another user's pin (adopt, Pin.release), or a refused
    peer (prefetch with known_peer_only, a certificate refused)."""


class Aborted(PegadError):
    """The daemon aborted the call (a block changed or a stream ended early)."""


class FailedPrecondition(PegadError):
    """The daemon is not set up for the call (e.g. prefetch without a peer on a
    daemon without --cluster-redis)."""
