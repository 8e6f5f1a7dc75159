package daemon_test

import (
	"context"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/index/redisindex"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestDrainLeavesClusterIndex: a clustered holder leaves the cluster index
// as its drain begins, not when it ends: while a peer still holds a
// session on it (the drain waits), its record is gone from the index, so
// requesters stop choosing it; the drain then finishes as usual.
func TestDrainLeavesClusterIndex(t *testing.T) {
	r := testutil.StartRedis(t)
	gate := newReadGate()
	acfg := testConfig(t)
	acfg.NodeID = "drainer"
	acfg.ClusterRedis = r.URL()
	acfg.ClusterTTL = time.Second // refreshed every 333 ms while registered
	acfg.ShutdownTimeout = 20 * time.Second
	a := startNode(t, acfg)
	b := startNode(t, testConfig(t), gate.option())

	obs, err := redisindex.Open(redisindex.Options{URLs: r.URL(), NodeID: "observer", Incarnation: "o1",
		TTL: acfg.ClusterTTL, Metrics: metricstest.NewCluster()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = obs.Close() })
	listed := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		nodes, err := obs.Nodes(ctx)
		if err != nil {
			t.Fatalf("nodes: %v", err)
		}
		for _, n := range nodes {
			if n.ID == acfg.NodeID {
				return true
			}
		}
		return false
	}
	eventually(t, "the holder registers", 5*time.Second, listed)

	fetched := heldFetch(t, a, b, gate)
	closed := closeAsync(a)
	eventually(t, "drain begins", 5*time.Second, func() bool { return a.d.Draining() })
	// Within a few heartbeats, not a TTL: Leave is synchronous with the
	// start of the drain, and the record must stay gone while it lasts.
	eventually(t, "the draining holder leaves the index", 3*time.Second, func() bool { return !listed() })
	time.Sleep(acfg.ClusterTTL) // heartbeats would have put it back by now
	if listed() {
		t.Fatal("the draining holder is back in the index")
	}
	notReturned(t, closed)

	close(gate.open)
	if r := <-fetched; r.err != nil {
		t.Fatalf("fetch of the granted session: %v", r.err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
}
