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
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
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
	n := &fakeNode{mem: ibvtest.MapMemory(t, 1<<20), met: metricstest.New()}
	var opts stackOptions
	opts.NICOptions = NICOptions{
		NodeID: id, Incarnation: id + "-1", Transport: "verbs", Devices: []ibv.Device{d}, Memory: n.mem,
		Metrics: n.met, Log: zerolog.Nop(),
	}
	opts.DialerOptions = DialerOptions{
		QPsPerPeer: 2, HandshakeTimeout: 5 * time.Second,
		Dial: func(string) (pegadv1.PeerServiceClient, error) {
			return directPeer{acc: holder.acc, tap: &holder.tap}, nil
		},
	}
	opts.AcceptorOptions = AcceptorOptions{IdleTimeout: idle}
	n.open(t, id, opts)
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
	hold.acc.SetRequesterActivity(act)
	req := newReapNode(t, "requester", idle, hold)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := req.dial.Get(ctx, "holder:1"); err != nil {
		t.Fatal(err)
	}
	if got := hold.nics.QPs(); got != 2 {
		t.Fatalf("holder QPs = %d, want 2", got)
	}
	time.Sleep(4 * idle)
	if got := hold.nics.QPs(); got != 2 {
		t.Fatalf("holder QPs = %d while the requester holds a session, want 2", got)
	}
	act.set("requester", 0) // its sessions ended or expired: it is gone
	if !eventually(10*time.Second, func() bool { return hold.nics.QPs() == 0 }) {
		t.Fatalf("holder QPs = %d, want the connection reaped", hold.nics.QPs())
	}
	if got := testutil.ToFloat64(hold.met.AcceptedReaped.WithLabelValues(reapIdle)); got != 1 {
		t.Errorf("reaped{idle} = %v, want 1", got)
	}
}
