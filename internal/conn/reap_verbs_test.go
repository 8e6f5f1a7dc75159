//go:build linux && cgo && !noverbs && pegad_fakeverbs

package conn

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
	"github.com/pegaflow/pegad/internal/ibv/verbs"
	"github.com/pegaflow/pegad/internal/metrics"
)

// fakeActivity is a holder lock table's view of requesters, set by tests.
type fakeActivity struct {
	mu   sync.Mutex // guards live
	live map[string]int
}

func (f *fakeActivity) set(node string, live int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.live[node] = live
}

func (f *fakeActivity) RequesterActivity(node string) (int, time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := f.live[node]; n > 0 {
		return n, 0
	}
	return 0, math.MaxInt64
}

// newReapNode is a fake-HCA node (one NIC, pegadfake0) with a short
// idle timeout; holder is nil for the holder itself.
func newReapNode(t *testing.T, id string, idle time.Duration, holder *fakeNode) *fakeNode {
	t.Helper()
	prov := verbs.NewWithOptions(verbs.Options{Library: verbs.FakeLibrary, SysfsRoot: fakeSysfs(t, map[string]int{"pegadfake0": 0})})
	d, err := prov.Open("pegadfake0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = d.Close() })
	n := &fakeNode{mem: ibvtest.MapMemory(t, 1<<20), met: metrics.NewForTest()}
	n.mgr, err = NewManager(Options{
		NodeID: id, Incarnation: id + "-1", Transport: "verbs", Devices: []ibv.Device{d}, Memory: n.mem,
		QPsPerPeer: 2, Metrics: n.met, Log: zerolog.Nop(), HandshakeTimeout: 5 * time.Second,
		IdleTimeout: idle,
		Dial: func(string) (pegadv1.PeerServiceClient, error) {
			return directPeer{m: holder.mgr, tap: &holder.tap}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.mgr.Close() })
	return n
}

// TestVerbsConnOfGoneRequesterReaped (issue 27 item 5): a verbs QP cannot
// say whether its requester still reads, so the holder never reaped a
// verbs connection of a dead requester (this test fails on that code).
// Now it is reaped once the requester has held no transfer session for
// the idle timeout, and kept while it holds one.
func TestVerbsConnOfGoneRequesterReaped(t *testing.T) {
	const idle = 150 * time.Millisecond
	act := &fakeActivity{live: map[string]int{"requester": 1}}
	hold := newReapNode(t, "holder", idle, nil)
	hold.mgr.SetRequesterActivity(act)
	req := newReapNode(t, "requester", idle, hold)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := req.mgr.Get(ctx, "holder:1"); err != nil {
		t.Fatal(err)
	}
	if got := hold.mgr.QPs(); got != 2 {
		t.Fatalf("holder QPs = %d, want 2", got)
	}
	time.Sleep(4 * idle)
	if got := hold.mgr.QPs(); got != 2 {
		t.Fatalf("holder QPs = %d while the requester holds a session, want 2", got)
	}
	act.set("requester", 0) // its sessions ended or expired: it is gone
	if !eventually(10*time.Second, func() bool { return hold.mgr.QPs() == 0 }) {
		t.Fatalf("holder QPs = %d, want the connection reaped", hold.mgr.QPs())
	}
	if got := testutil.ToFloat64(hold.met.AcceptedReaped.WithLabelValues(reapIdle)); got != 1 {
		t.Errorf("reaped{idle} = %v, want 1", got)
	}
}
