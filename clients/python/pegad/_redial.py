"""The client's data connection across daemon restarts: the connection in use,
dialled again by the first call after it broke or after the daemon closed it
(a restart, `systemctl restart pegad`).

It owns which DataConn a call uses; it never resends a request: a new
connection is only dialled before anything of a call was sent. A call whose
request was on the wire when the connection broke fails (the daemon may or
may not have applied it); the next call dials again. Leases, writers,
readers and pins stay on the connection that took them (their ids mean
nothing on another one), and end with it.
"""

from __future__ import annotations

import threading

from . import errors
from ._data import DataConn


class DataLink:
    """The current data connection of one client. Thread-safe."""

    def __init__(self, path: str, timeout: float | None) -> None:
        self._path = path
        self._timeout = timeout
        self._mu = threading.Lock()  # guards _conn, _closed, reconnects
        self._conn = DataConn(path, timeout)  # the first dial raises: no client without a daemon
        self._closed = False
        self.reconnects = 0  # connections dialled after the first

    @property
    def current(self) -> DataConn:
        """The connection in use now (possibly broken); no I/O."""
        return self._conn

    @property
    def closed(self) -> bool:
        return self._closed

    def get(self) -> DataConn:
        """A connection a call can be sent on: the current one while it is
        alive, else a new one (Unavailable while the daemon cannot be
        reached: the next call tries again). ClientClosed after close."""
        with self._mu:
            if self._closed:
                raise errors.ClientClosed("pegad client closed")
            c = self._conn
            if c.alive():
                return c
            c.retire()
            self._conn = DataConn(self._path, self._timeout)
            self.reconnects += 1
            return self._conn

    def close(self) -> None:
        """Close the current connection (the daemon ends its leases)."""
        with self._mu:
            self._closed = True
            c = self._conn
        c.close()
