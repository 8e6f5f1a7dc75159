"""Lease renewal and expiry: a lease not renewed ends after the daemon's
--lock-timeout, and the client says so instead of returning bytes that
may be torn."""

import time

import pytest

import pegad
from conftest import rand_hash
from harness import Daemon, wait_until


def test_renew_live_and_ended(client, ns):
    h = rand_hash()
    client.put(ns, h, b"renew me")
    with client.lease(ns, h) as r:
        r.renew()
    with pytest.raises(pegad.LeaseEnded):
        r.renew()  # released: the daemon no longer knows the id
    w = client.alloc(ns, rand_hash(), 16)
    w.renew()
    w.abort()
    with pytest.raises(pegad.LeaseEnded):
        w.renew()


@pytest.fixture(scope="module")
def short_daemon(bins):
    d = Daemon(bins, "pytest-short", extra=("--lock-timeout", "2s", "--gc-interval", "100ms"))
    try:
        yield d
    finally:
        d.stop()


def test_expired_lease_is_reported(short_daemon, ns):
    with pegad.Client(short_daemon.socket, timeout=60) as c:
        assert c.lease_timeout == 2.0
        h = rand_hash()
        c.put(ns, h, b"e" * 4096)
        r = c.lease(ns, h)
        w = c.alloc(ns, rand_hash(), 4096)
        wait_until("the leases to expire", lambda: short_daemon.stats()["pinned_blocks"] == 0
                   and short_daemon.stats()["pool_used"] == 4096, timeout=30)
        with pytest.raises(pegad.LeaseEnded):
            r.release()
        with pytest.raises(pegad.LeaseEnded):
            w.commit()
        # Renewed in time, a lease outlives the timeout.
        r = c.lease(ns, h)
        deadline = time.monotonic() + 3.5
        while time.monotonic() < deadline:
            r.renew()
            time.sleep(0.1)
        r.release()
