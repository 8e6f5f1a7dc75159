package daemon_test

import (
	"testing"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// TestOneSweeperForBothLeaseTables: the daemon runs one lease sweeper, and
// it sweeps every table — the holder's transfer locks, the data socket's
// leases and the P/D handoffs — so an unreleased session ends at its lock timeout and
// the watchdog sees the sweeper tick. Before, two sweepers ran and the
// watchdog saw only the holder's.
func TestOneSweeperForBothLeaseTables(t *testing.T) {
	cfg := testConfig(t)
	cfg.LockTimeout = 300 * time.Millisecond
	cfg.GCInterval = 20 * time.Millisecond
	n := startNode(t, cfg)
	if !n.d.SweepsHolderAndData() {
		t.Fatal("the sweeper does not expire exactly the holder's locks, the data socket's leases and the handoffs")
	}
	putBlock(t, n, "ns", []byte{7}, pattern(1000, 7), false)
	q, err := n.peer.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{{7}}, Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "i"}})
	if err != nil || q.GetSessionId() == "" {
		t.Fatalf("query: %v %v", q, err)
	}
	eventually(t, "the sweeper expires the unreleased session", 5*time.Second, func() bool {
		return n.d.HolderSessions() == 0
	})
	if why := n.d.Unhealthy(time.Now()); why != "" {
		t.Fatalf("unhealthy with the sweeper running: %s", why)
	}
}
