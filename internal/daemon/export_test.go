package daemon

import (
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/lease"
)

// Hooks for the tests in package daemon_test, which start nodes through
// internal/testutil/cluster (an in-package test cannot import it: cluster
// imports daemon). They read or poke what a test checks and nothing else.

// StoreBlocks is the number of blocks in the store.
func (d *Daemon) StoreBlocks() uint64 { return d.store.Stats().Blocks }

// Draining reports whether shutdown has begun.
func (d *Daemon) Draining() bool { return d.draining.Load() }

// HolderSessions is the number of lock sessions the holder keeps.
func (d *Daemon) HolderSessions() int { return d.holder.Locks().Len() }

// KVSubscribers is the number of KV-event subscribers seen.
func (d *Daemon) KVSubscribers() int { return d.kv.Subscribers() }

// Logger is the daemon's logger.
func (d *Daemon) Logger() zerolog.Logger { return d.log }

// StopPeerServer stops the peer gRPC server under a running daemon.
func (d *Daemon) StopPeerServer() { d.peerSrv.Stop() }

// Unhealthy is the watchdog's reason to stop pinging ("" when healthy).
func (d *Daemon) Unhealthy(now time.Time) string { return d.unhealthy(now) }

// SetExtendEvery sets how often Start asks systemd for more time until the
// test ends.
func SetExtendEvery(t testing.TB, every time.Duration) {
	old := extendEvery
	extendEvery = every
	t.Cleanup(func() { extendEvery = old })
}

// SetVerbsProbe replaces the verbs availability probe until the test ends.
func SetVerbsProbe(t testing.TB, probe func() (bool, string)) {
	old := verbsProbe
	verbsProbe = probe
	t.Cleanup(func() { verbsProbe = old })
}

// SweepsHolderAndData reports whether the daemon's one lease sweeper
// expires exactly the holder's lock table, the data socket's leases and
// the P/D handoffs.
func (d *Daemon) SweepsHolderAndData() bool {
	es, ok := d.sweeps.Expirer.(lease.Expirers)
	return ok && len(es) == 3 && es[0] == lease.Expirer(d.holder.Locks()) && es[1] == lease.Expirer(d.data) &&
		es[2] == lease.Expirer(d.handoffs)
}
