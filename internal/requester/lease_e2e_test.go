package requester_test

// Lease end to end (docs/lessons.md L10, issue 5 bullet 5) against a real holder:
// renewals the real lock table accepts, and the fast reclaim of a restarted
// requester's locks. The harness is requester_e2e_test.go's.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
)

// TestE2ERenewAgainstRealHolder (GAP-5): a read that lasts several lock
// timeouts of a real holder keeps its lock by RenewTransferLock, which the
// holder only accepts from the session's owner. The fetch succeeds
// byte-identical; nothing lapsed on the holder.
func TestE2ERenewAgainstRealHolder(t *testing.T) {
	// 1 s, not less: a renewal must fit in half a lock timeout on a
	// loaded 2-core CI machine under -race (at 400 ms one failed there).
	const lockTimeout = time.Second
	h := newE2ENode(t, "holder", 64*mib, true, lockTimeout)
	req := newE2ENode(t, "requester", 64*mib, false, 0)
	r := rand.New(rand.NewPCG(5, 40))
	want := map[string][]byte{}
	var hashes [][]byte
	for i := range 8 {
		hash := fmt.Sprintf("lease-%d", i)
		want[hash] = putRandom(t, h, r, "ns", hash, []store.SlotSize{{KSize: 64 << 10, VSize: 64 << 10}})
		hashes = append(hashes, []byte(hash))
	}
	// Connect first, so the delay slows only the fetch's READs.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := req.conns.dial.Get(ctx, h.addr); err != nil {
		t.Fatal(err)
	}
	// 16 READs over 2 QPs, each response held 400 ms by the holder's
	// responder: the read lasts past 3 lock timeouts, and a response
	// still arrives far inside the requester's retry budget.
	for _, d := range h.devs {
		d.SetFaults(tcp.Faults{ResponseDelay: 400 * time.Millisecond})
	}

	res, err := req.engine.Prefetch(ctx, h.addr, "ns", hashes)
	if err != nil {
		t.Fatalf("prefetch: %v (holder renewals %v, renew failures %v)", err,
			metrics.Value(h.m.LockRenewals), metrics.Value(req.m.RenewFailures))
	}
	if res.Duration < 3*lockTimeout {
		t.Fatalf("test setup: the fetch took %v, want more than 3 lock timeouts (%v)", res.Duration, 3*lockTimeout)
	}
	for _, b := range res.Blocks {
		if b.Status != requester.StatusFetched {
			t.Fatalf("%s: %v %v", b.Hash, b.Status, b.Err)
		}
		if !bytes.Equal(readBlock(t, req, "ns", string(b.Hash)), want[string(b.Hash)]) {
			t.Fatalf("%s: fetched bytes differ from the holder's", b.Hash)
		}
	}
	for _, c := range []struct {
		name string
		got  float64
		ok   func(float64) bool
		want string
	}{
		{"holder pegaflow_transfer_lock_renewals_total", metrics.Value(h.m.LockRenewals), func(v float64) bool { return v >= 2 }, ">= 2"},
		{"holder renew_transfer_lock OK", holderRPC(h, metrics.RPCRenewLock, "OK"), func(v float64) bool { return v >= 2 }, ">= 2"},
		{"holder pegaflow_transfer_lock_timeouts_total", metrics.Value(h.m.LockTimeouts), func(v float64) bool { return v == 0 }, "0"},
		{"holder pegaflow_transfer_lock_release_not_live_total", metrics.Value(h.m.LockEndedNotLive), func(v float64) bool { return v == 0 }, "0"},
		{"requester pegaflow_transfer_lock_renew_failures_total", metrics.Value(req.m.RenewFailures), func(v float64) bool { return v == 0 }, "0"},
	} {
		if !c.ok(c.got) {
			t.Errorf("%s = %v, want %s", c.name, c.got, c.want)
		}
	}
	checkHolderClean(t, h)
	t.Logf("read of %v under a %v lock: %v renewals", res.Duration, lockTimeout, metrics.Value(h.m.LockRenewals))
}

// TestE2ERequesterRestartReclaims (GAP-6): engine 1 (node "r", incarnation
// "i1") holds a lock, stopped just before its release; engine 2, a restart
// of node "r" (incarnation "i2"), fetches from the same holder. The holder
// reclaims engine 1's session at once, long before the lock timeout, and
// engine 1, when it goes on, discards what it read.
func TestE2ERequesterRestartReclaims(t *testing.T) {
	const lockTimeout = 60 * time.Second
	h := newE2ENode(t, "holder", 64*mib, true, lockTimeout)
	r := rand.New(rand.NewPCG(6, 1))
	want := map[string][]byte{}
	var hashes [][]byte
	for i := range 4 {
		hash := fmt.Sprintf("restart-%d", i)
		want[hash] = putRandom(t, h, r, "ns", hash, []store.SlotSize{{KSize: 256 << 10, VSize: 256 << 10}})
		hashes = append(hashes, []byte(hash))
	}

	atRelease := make(chan struct{})
	unblock := make(chan struct{})
	old := startE2ENode(t, e2eOptions{id: "r", incarnation: "i1", poolSize: 32 * mib,
		faults: func(ctx context.Context, _, phase string) {
			if phase != requester.PhaseRelease {
				return
			}
			close(atRelease)
			select { // held with its lock taken and its read done
			case <-unblock:
			case <-ctx.Done():
			}
		}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	type outcome struct {
		res *requester.Result
		err error
	}
	oldDone := make(chan outcome, 1)
	go func() {
		res, err := old.engine.Prefetch(ctx, h.addr, "ns", hashes)
		oldDone <- outcome{res, err}
	}()
	unblocked := false
	defer func() {
		if !unblocked {
			close(unblock)
			<-oldDone
		}
	}()
	select {
	case <-atRelease:
	case o := <-oldDone:
		t.Fatalf("engine 1 finished without reaching its release: %v", o.err)
	case <-time.After(10 * time.Second):
		t.Fatal("engine 1 did not reach its release")
	}
	if n := h.holder.Locks().Len(); n != 1 {
		t.Fatalf("holder has %d sessions while engine 1 holds its lock, want 1", n)
	}

	// Node "r" restarts: a new engine, a new incarnation.
	start := time.Now()
	restarted := startE2ENode(t, e2eOptions{id: "r", incarnation: "i2", poolSize: 32 * mib})
	res, err := restarted.engine.Prefetch(ctx, h.addr, "ns", hashes)
	if err != nil {
		t.Fatalf("restarted engine: %v", err)
	}
	for _, b := range res.Blocks {
		if b.Status != requester.StatusFetched {
			t.Fatalf("restarted engine: %s: %v %v", b.Hash, b.Status, b.Err)
		}
		if !bytes.Equal(readBlock(t, restarted, "ns", string(b.Hash)), want[string(b.Hash)]) {
			t.Fatalf("restarted engine: %s: bytes differ", b.Hash)
		}
	}
	took := time.Since(start)
	if got := metrics.Value(h.m.IncarnationReclaim); got != 1 {
		t.Fatalf("holder pegaflow_transfer_lock_incarnation_reclaims_total = %v after the restart, want 1", got)
	}
	if n := h.holder.Locks().Len(); n != 0 {
		t.Errorf("holder has %d sessions after the restarted engine's fetch, want 0 (old one reclaimed)", n)
	}
	if took > lockTimeout/4 {
		t.Errorf("reclaim took %v, want it long before the lock timeout %v", took, lockTimeout)
	}
	if got := metrics.Value(h.m.LockTimeouts); got != 0 {
		t.Errorf("holder lock timeouts = %v: the old session expired instead of being reclaimed", got)
	}

	// Engine 1 goes on: the holder refuses its stale incarnation; what it
	// read is discarded, nothing indexed.
	unblocked = true
	close(unblock)
	o := <-oldDone
	if !errors.Is(o.err, requester.ErrDiscarded) {
		t.Fatalf("engine 1: err = %v, want ErrDiscarded", o.err)
	}
	for _, b := range o.res.Blocks {
		if b.Status != requester.StatusDiscarded {
			t.Errorf("engine 1: %s: %v, want discarded", b.Hash, b.Status)
		}
		if old.store.Has(store.Key{Namespace: "ns", Hash: string(b.Hash)}) {
			t.Errorf("engine 1 indexed %s read under a reclaimed lock", b.Hash)
		}
	}
	if got := metrics.Value(old.m.FetchTotal.WithLabelValues(metrics.FetchDiscarded)); got != 1 {
		t.Errorf("engine 1 fetch_total{discarded} = %v, want 1", got)
	}
	if got := metrics.Value(old.m.GuardReleaseFails); got != 0 {
		t.Errorf("engine 1 guard release failures = %v, want 0 (the holder had reclaimed the session)", got)
	}
	// The holder's record of engine 1's session: ended because its
	// requester restarted (asked as the node's current incarnation).
	client, err := restarted.peers.Get(h.addr)
	if err != nil {
		t.Fatal(err)
	}
	rr, err := client.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{
		SessionId: o.res.SessionID, Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "i2"}})
	if err != nil || rr.GetWasLive() || rr.GetEnd() != pegadv1.SessionEnd_SESSION_END_REQUESTER_RESTARTED {
		t.Errorf("engine 1's session %s: end %v was_live %v err %v, want REQUESTER_RESTARTED, not live",
			o.res.SessionID, rr.GetEnd(), rr.GetWasLive(), err)
	}
	if n := h.holder.Locks().Len(); n != 0 {
		t.Errorf("holder has %d sessions left", n)
	}
}
