package requester

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// TestRetriedReleaseAlreadyReleasedKeeps (issue 15 item 7): the first
// release ends the live session but its reply is lost; the retry answers
// ALREADY_RELEASED, which means our own earlier attempt released a live
// lock: the data is kept and indexed.
func TestRetriedReleaseAlreadyReleasedKeeps(t *testing.T) {
	hs := newHarness(t)
	hs.h.releaseLost = func(_ string, attempt int) bool { return attempt == 1 }
	h := hashes("lost", 2)
	res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", h)
	if err != nil {
		t.Fatalf("prefetch after a lost release reply: %v", err)
	}
	for _, b := range res.Blocks {
		if b.Status != StatusFetched || !hs.st.Has(store.Key{Namespace: "ns", Hash: string(b.Hash)}) {
			t.Errorf("block %s: %v, want fetched and indexed", b.Hash, b.Status)
		}
	}
	if _, releaseOK, _ := hs.h.counts(); releaseOK != 1 {
		t.Errorf("live releases = %d, want 1", releaseOK)
	}
	if got := fetchTotal(hs.m, metrics.FetchDiscarded); got != 0 {
		t.Errorf("discarded = %v", got)
	}
	hs.st.check(t)
}

// TestJoinerRetriesWhenOwnerCancelled (item 8): a Prefetch waiting on
// another call's fetch of the same block does not inherit that call's
// cancel: it fetches the block itself.
func TestJoinerRetriesWhenOwnerCancelled(t *testing.T) {
	hs := newHarness(t)
	var reads atomic.Int64
	hs.cs.r.read = func(ctx context.Context, _ []conn.ReadOp) error {
		if reads.Add(1) == 1 {
			<-ctx.Done() // the owner's read runs until the owner cancels
			return ctx.Err()
		}
		return nil
	}
	h := hashes("w", 1)
	ownerCtx, cancelOwner := context.WithCancel(context.Background())
	defer cancelOwner()
	ownerErr := make(chan error, 1)
	go func() {
		_, err := hs.e.Prefetch(ownerCtx, "peer:1", "ns", h)
		ownerErr <- err
	}()
	waitFor(t, func() bool { return reads.Load() == 1 })
	type out struct {
		res *Result
		err error
	}
	joiner := make(chan out, 1)
	go func() {
		res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", h)
		joiner <- out{res, err}
	}()
	waitFor(t, func() bool {
		for _, f := range hs.e.InFlight() {
			if f.Phase == PhaseWait {
				return true
			}
		}
		return false
	})
	cancelOwner()
	if err := <-ownerErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("owner: %v, want canceled", err)
	}
	j := <-joiner
	if j.err != nil || j.res.Blocks[0].Status != StatusFetched {
		t.Fatalf("joiner: %v (status %v), want fetched by itself", j.err, j.res.Blocks[0].Status)
	}
	if n, _, _ := hs.h.counts(); n != 2 || reads.Load() != 2 {
		t.Errorf("sessions %d reads %d, want 2 and 2 (owner's, then the joiner's own)", n, reads.Load())
	}
	if got := fetchTotal(hs.m, metrics.FetchCanceled); got != 1 {
		t.Errorf("canceled fetches = %v, want 1 (the owner only)", got)
	}
	hs.h.checkReleasedOnce(t)
}

// TestRenewFromLockTime (item 9): renewals count from the lock, and run
// during staging: a 300 ms lock, 200 ms staging and a 400 ms read
// complete with renewals instead of passing the transfer deadline.
func TestRenewFromLockTime(t *testing.T) {
	slowStage := hooks{phase: func(_ context.Context, _, phase string) {
		if phase == PhaseStage {
			time.Sleep(200 * time.Millisecond)
		}
	}}
	hs := newHarness(t, withHooks(slowStage))
	hs.h.lockTimeout = 300 * time.Millisecond
	hs.cs.r.read = func(ctx context.Context, _ []conn.ReadOp) error {
		select {
		case <-time.After(400 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("stage", 1))
	if err != nil {
		t.Fatalf("prefetch: %v", err)
	}
	if res.Blocks[0].Status != StatusFetched {
		t.Fatalf("status %v", res.Blocks[0].Status)
	}
	if _, _, renewals := hs.h.counts(); renewals < 2 {
		t.Errorf("renewals = %d, want >= 2 over 600 ms of a 300 ms lock", renewals)
	}
	hs.h.checkReleasedOnce(t)
}

// TestLockRPCBoundedByCallerDeadline (item 10): a holder slow to answer
// the lock query does not hold a caller past its deadline; the session it
// grants later is still released (by the guard, counted as an abort).
func TestLockRPCBoundedByCallerDeadline(t *testing.T) {
	hs := newHarness(t)
	hs.h.queryHook = func(ctx context.Context) {
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := hs.e.Prefetch(ctx, "peer:1", "ns", hashes("slowlock", 1))
	took := time.Since(start)
	if !errors.Is(err, ErrDeadline) {
		t.Fatalf("err = %v, want ErrDeadline", err)
	}
	if took > 600*time.Millisecond {
		t.Fatalf("prefetch with a 100ms deadline took %v (holder answers after 1s)", took)
	}
	waitFor(t, func() bool { _, ok, _ := hs.h.counts(); return ok == 1 })
	hs.h.checkReleasedOnce(t)
	if got := metrics.Value(hs.m.GuardAborts); got != 1 {
		t.Errorf("guard aborts = %v, want 1", got)
	}
}

// TestInnocentReadRetried (item 11): a read that fails because the
// connection broke under it (another fetch's cancel flushed shared QPs)
// while its own context is fine is retried once on a fresh connection.
func TestInnocentReadRetried(t *testing.T) {
	tests := []struct {
		name     string
		failures int64
		wantErr  error
	}{
		{"invalidated once: retried and kept", 1, nil},
		{"broken twice: retried only once", 2, ErrConnection},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			hs := newHarness(t)
			var reads atomic.Int64
			hs.cs.r.read = func(context.Context, []conn.ReadOp) error {
				if reads.Add(1) <= tc.failures {
					return fmt.Errorf("conn: read: %w (another fetch cancelled)", conn.ErrSessionInvalidated)
				}
				return nil
			}
			res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("inno", 1))
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("err = %v, want %v", err, tc.wantErr)
			}
			if tc.wantErr == nil && res.Blocks[0].Status != StatusFetched {
				t.Fatalf("status %v", res.Blocks[0].Status)
			}
			hs.cs.mu.Lock()
			gets := hs.cs.gets
			hs.cs.mu.Unlock()
			if reads.Load() != 2 || gets != 2 || hs.cs.invalidations() < 1 {
				t.Errorf("reads %d gets %d invalidations %d, want 2, 2 (a fresh connection), >= 1",
					reads.Load(), gets, hs.cs.invalidations())
			}
			hs.h.checkReleasedOnce(t)
			hs.st.check(t)
		})
	}
}
