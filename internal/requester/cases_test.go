package requester

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

const mib = 1 << 20

// TestLocalAllocationFailureKeepsConnection: docs/lessons.md L7. A fetch that cannot
// stage fails with ErrLocalResource; the connection is not invalidated and
// the lock is released on the normal path.
func TestLocalAllocationFailureKeepsConnection(t *testing.T) {
	hs := newHarness(t)
	hs.st.capacity = 1 * mib
	hs.h.shape = func(string) ([]store.SlotSize, int, bool) {
		return []store.SlotSize{{KSize: mib, VSize: mib}}, 0, true
	}
	_, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("big", 1))
	if !errors.Is(err, ErrLocalResource) || !errors.Is(err, store.ErrNoSpace) {
		t.Fatalf("err = %v, want ErrLocalResource wrapping ErrNoSpace", err)
	}
	if n := hs.cs.invalidations(); n != 0 {
		t.Fatalf("Invalidate called %d times for a local error", n)
	}
	hs.h.checkReleasedOnce(t)
	if got := metrics.Value(hs.m.GuardAborts); got != 0 {
		t.Errorf("guard aborts = %v", got)
	}
	if got := fetchErrors(hs.m, classLocal); got != 1 {
		t.Errorf("fetch_errors{local_resource} = %v", got)
	}
	hs.st.check(t)
}

// TestErrorClasses: each failure lands in its class, and only connection
// breakage from the data path invalidates.
func TestErrorClasses(t *testing.T) {
	cases := []struct {
		name       string
		getErr     error
		queryErr   error
		readErr    error
		class      error
		label      string
		invalidate bool
		locked     bool
	}{
		{name: "handshake failed", getErr: fmt.Errorf("%w: dial", conn.ErrConnectionBroken), class: ErrConnection, label: classConnection},
		{name: "holder unavailable", queryErr: status.Error(codes.Unavailable, "down"), class: ErrConnection, label: classConnection},
		{name: "holder refuses", queryErr: status.Error(codes.PermissionDenied, "no"), class: ErrRemote, label: classRemote},
		{name: "holder bad request", queryErr: status.Error(codes.InvalidArgument, "no"), class: ErrRemote, label: classRemote},
		{name: "holder deadline", queryErr: status.Error(codes.DeadlineExceeded, "slow"), class: ErrDeadline, label: classDeadline},
		{name: "qp broken", readErr: fmt.Errorf("%w: wc RETRY_EXC_ERR", conn.ErrConnectionBroken), class: ErrConnection, label: classConnection, invalidate: true, locked: true},
		{name: "session invalidated", readErr: conn.ErrSessionInvalidated, class: ErrConnection, label: classConnection, invalidate: true, locked: true},
		{name: "stale snapshot", readErr: conn.ErrRemoteMemory, class: ErrConnection, label: classConnection, invalidate: true, locked: true},
		{name: "bad local op", readErr: fmt.Errorf("%w: outside registered memory", conn.ErrInvalidOp), class: ErrLocalResource, label: classLocal, locked: true},
		{name: "unknown read error", readErr: errors.New("weird"), class: ErrConnection, label: classConnection, locked: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hs := newHarness(t)
			hs.cs.getErr = c.getErr
			if c.queryErr != nil {
				hs.h.queryErr = func() error { return c.queryErr }
			}
			hs.cs.r.read = func(context.Context, []conn.ReadOp) error { return c.readErr }
			_, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("x", 2))
			if !errors.Is(err, c.class) {
				t.Fatalf("err = %v, want class %v", err, c.class)
			}
			for _, cause := range []error{c.getErr, c.readErr} {
				if cause != nil && !errors.Is(err, cause) {
					t.Errorf("err %v does not wrap cause %v", err, cause)
				}
			}
			if got := fetchErrors(hs.m, c.label); got != 1 {
				t.Errorf("fetch_errors{%s} = %v", c.label, got)
			}
			if got := hs.cs.invalidations() > 0; got != c.invalidate {
				t.Errorf("invalidated = %v, want %v", got, c.invalidate)
			}
			if n, _, _ := hs.h.counts(); (n == 1) != c.locked {
				t.Errorf("sessions = %d, locked want %v", n, c.locked)
			}
			hs.h.checkReleasedOnce(t)
			hs.st.check(t)
		})
	}
}

func TestInvalidInput(t *testing.T) {
	hs := newHarness(t)
	long := strings.Repeat("n", limits.MaxNamespaceLen+1)
	cases := []struct {
		name, peer, ns string
		hashes         [][]byte
	}{
		{"no peer", "", "ns", hashes("a", 1)},
		{"no namespace", "p:1", "", hashes("a", 1)},
		{"long namespace", "p:1", long, hashes("a", 1)},
		{"no hashes", "p:1", "ns", nil},
		{"empty hash", "p:1", "ns", [][]byte{{}}},
		{"long hash", "p:1", "ns", [][]byte{make([]byte, limits.MaxHashLen+1)}},
		{"too many", "p:1", "ns", hashes("a", MaxHashes+1)},
	}
	for _, c := range cases {
		_, err := hs.e.Prefetch(context.Background(), c.peer, c.ns, c.hashes)
		if !errors.Is(err, ErrInvalidInput) {
			t.Errorf("%s: err = %v", c.name, err)
		}
	}
	if got := fetchErrors(hs.m, classInvalid); got != float64(len(cases)) {
		t.Errorf("fetch_errors{invalid} = %v", got)
	}
	if hs.cs.gets != 0 {
		t.Error("invalid input reached the connection manager")
	}
}

func TestMissingOnPeer(t *testing.T) {
	hs := newHarness(t)
	hs.h.shape = func(h string) ([]store.SlotSize, int, bool) {
		return []store.SlotSize{{KSize: 64}}, 0, strings.HasPrefix(h, "have")
	}
	res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", append(hashes("have", 1), hashes("lack", 2)...))
	if err != nil {
		t.Fatal(err)
	}
	want := []Status{StatusFetched, StatusMissingOnPeer, StatusMissingOnPeer}
	for i, b := range res.Blocks {
		if b.Status != want[i] {
			t.Errorf("block %d: %v, want %v", i, b.Status, want[i])
		}
	}
	res, err = hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("lack", 2))
	if err != nil || res.SessionID != "" {
		t.Fatalf("all missing: err %v session %q", err, res.SessionID)
	}
	if got := fetchTotal(hs.m, metrics.FetchMissing); got != 1 {
		t.Errorf("fetch_total{missing} = %v", got)
	}
	hs.h.checkReleasedOnce(t)
}

// TestWasLiveFalseDiscards: docs/lessons.md L10. A lock that lapsed during the read
// yields no indexed block; the staging memory goes back.
func TestWasLiveFalseDiscards(t *testing.T) {
	hs := newHarness(t)
	hs.h.notLive = func(string) bool { return true }
	res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("late", 3))
	if !errors.Is(err, ErrDiscarded) {
		t.Fatalf("err = %v, want ErrDiscarded", err)
	}
	for i, b := range res.Blocks {
		if b.Status != StatusDiscarded {
			t.Errorf("block %d: %v", i, b.Status)
		}
		if hs.st.Has(store.Key{Namespace: "ns", Hash: string(b.Hash)}) {
			t.Errorf("block %d indexed after discard", i)
		}
	}
	if res.Bytes != 0 {
		t.Errorf("bytes = %d", res.Bytes)
	}
	if u := hs.st.stagingUsed(); u != 0 {
		t.Errorf("staging bytes not returned: %d", u)
	}
	if got := fetchTotal(hs.m, metrics.FetchDiscarded); got != 1 {
		t.Errorf("fetch_total{discarded} = %v", got)
	}
	hs.h.checkReleasedOnce(t)
	hs.st.check(t)
}

// TestReleaseRefusedAsStaleDiscards: issue 5 bullet 5 from the old
// incarnation's side. The holder refuses the release of a requester whose
// newer incarnation it has seen (FailedPrecondition), having reclaimed the
// session: the fetch is discarded, not failed, and no release failure is
// counted (nothing is left for the holder's GC).
func TestReleaseRefusedAsStaleDiscards(t *testing.T) {
	hs := newHarness(t)
	hs.h.releaseErr = func(string, int) error {
		return status.Error(codes.FailedPrecondition, `stale requester incarnation: "inc-1", current is "inc-2"`)
	}
	res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("stale", 2))
	if !errors.Is(err, ErrDiscarded) {
		t.Fatalf("err = %v, want ErrDiscarded", err)
	}
	for i, b := range res.Blocks {
		if b.Status != StatusDiscarded {
			t.Errorf("block %d: %v, want discarded", i, b.Status)
		}
		if hs.st.Has(store.Key{Namespace: "ns", Hash: string(b.Hash)}) {
			t.Errorf("block %d indexed under a reclaimed lock", i)
		}
	}
	if got := fetchTotal(hs.m, metrics.FetchDiscarded); got != 1 {
		t.Errorf("fetch_total{discarded} = %v, want 1", got)
	}
	if got := metrics.Value(hs.m.GuardReleaseFails); got != 0 {
		t.Errorf("guard release failures = %v, want 0", got)
	}
	if u := hs.st.stagingUsed(); u != 0 {
		t.Errorf("staging bytes not returned: %d", u)
	}
	hs.st.check(t)
}

// TestFakeHolderChecksOwner: the fake holder refuses a renewal or release
// from another node, as the real one does, so the renew and release tests
// above prove the engine sends its identity.
func TestFakeHolderChecksOwner(t *testing.T) {
	h := newFakeHolder()
	ctx := context.Background()
	q, err := h.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("x")}, Requester: &pegadv1.Requester{NodeId: "a"}})
	if err != nil {
		t.Fatal(err)
	}
	sid := q.GetSessionId()
	for _, who := range []*pegadv1.Requester{nil, {NodeId: "b"}} {
		if _, err := h.RenewTransferLock(ctx, &pegadv1.RenewTransferLockRequest{SessionId: sid, Requester: who}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("renew as %v: %v, want PermissionDenied", who, err)
		}
		if _, err := h.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{SessionId: sid, Requester: who}); status.Code(err) != codes.PermissionDenied {
			t.Errorf("release as %v: %v, want PermissionDenied", who, err)
		}
	}
	if _, err := h.RenewTransferLock(ctx, &pegadv1.RenewTransferLockRequest{SessionId: sid, Requester: &pegadv1.Requester{NodeId: "a"}}); err != nil {
		t.Errorf("renew as owner: %v", err)
	}
	if r, err := h.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{SessionId: sid, RequesterId: "a"}); err != nil || !r.GetWasLive() {
		t.Errorf("release as owner (legacy id): %v %v", r, err)
	}
}

// TestRenewDuringLongRead: a read longer than the lock timeout renews the
// lock and completes.
func TestRenewDuringLongRead(t *testing.T) {
	hs := newHarness(t)
	hs.h.lockTimeout = 150 * time.Millisecond
	hs.cs.r.read = func(ctx context.Context, _ []conn.ReadOp) error {
		select {
		case <-time.After(500 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("long", 1))
	if err != nil {
		t.Fatal(err)
	}
	if res.Blocks[0].Status != StatusFetched {
		t.Fatalf("status %v", res.Blocks[0].Status)
	}
	if _, _, renewals := hs.h.counts(); renewals < 2 {
		t.Errorf("renewals = %d, want >= 2 over a read of 3+ lock timeouts", renewals)
	}
	if got := metrics.Value(hs.m.RenewFailures); got != 0 {
		t.Errorf("renew failures = %v, want 0", got)
	}
	hs.h.checkReleasedOnce(t)
}

// TestTransferDeadline: when the lock cannot be renewed the read is cut at
// the lock's deadline (minus a margin) and fails as a deadline, releasing
// the lock on the normal path.
func TestTransferDeadline(t *testing.T) {
	hs := newHarness(t)
	hs.h.lockTimeout = 200 * time.Millisecond
	hs.h.renewErr = func() error { return status.Error(codes.NotFound, "gone") }
	start := time.Now()
	hs.cs.r.read = func(ctx context.Context, _ []conn.ReadOp) error {
		<-ctx.Done()
		return ctx.Err()
	}
	_, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("slow", 1))
	took := time.Since(start)
	if !errors.Is(err, ErrDeadline) {
		t.Fatalf("err = %v, want ErrDeadline", err)
	}
	if took < 150*time.Millisecond || took > 2*time.Second {
		t.Errorf("read cut after %v, want about lock timeout minus margin (180ms)", took)
	}
	// Renewals tick every 66ms until the cut at 180ms, each refused (two
	// on an idle host; at least one however late the ticker runs).
	if got := metrics.Value(hs.m.RenewFailures); got < 1 {
		t.Errorf("renew failures = %v, want >= 1 (every renewal was refused)", got)
	}
	if got := metrics.Value(hs.m.GuardAborts); got != 0 {
		t.Errorf("guard aborts = %v, want 0 (handled error)", got)
	}
	if hs.cs.invalidations() != 0 {
		t.Error("deadline invalidated the connection")
	}
	hs.h.checkReleasedOnce(t)
	hs.st.check(t)
}

// TestChunkSizing: docs/lessons.md L5.
func TestChunkSizing(t *testing.T) {
	oneMiB := func(string) ([]store.SlotSize, int, bool) {
		return []store.SlotSize{{KSize: mib / 2, VSize: mib / 2}}, 0, true
	}
	t.Run("16MiB pool, 12MiB fetch", func(t *testing.T) {
		hs := newHarness(t)
		hs.st.capacity = 16 * mib
		hs.h.shape = oneMiB
		res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("small", 12))
		if err != nil {
			t.Fatal(err)
		}
		if res.Bytes != 12*mib {
			t.Errorf("bytes = %d", res.Bytes)
		}
		if a := hs.st.allocSizes(); len(a) != 1 || a[0] != 12*mib {
			t.Errorf("allocations %v, want one of 12 MiB", a)
		}
	})
	t.Run("600MiB fetch", func(t *testing.T) {
		hs := newHarness(t)
		hs.h.shape = oneMiB
		if _, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("large", 600)); err != nil {
			t.Fatal(err)
		}
		a := hs.st.allocSizes()
		var sum uint64
		for _, n := range a {
			if n > MaxChunk {
				t.Errorf("chunk of %d > MaxChunk", n)
			}
			sum += n
		}
		if len(a) < 3 || sum != 600*mib {
			t.Errorf("allocations %v (sum %d), want >= 3 chunks summing to 600 MiB", a, sum)
		}
	})
	t.Run("block larger than chunk", func(t *testing.T) {
		hs := newHarness(t, withOpts(func(o *Options) { o.MaxChunk = mib }))
		hs.h.shape = func(string) ([]store.SlotSize, int, bool) {
			return []store.SlotSize{{KSize: 3 * mib}}, 0, true
		}
		if _, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("huge", 2)); err != nil {
			t.Fatal(err)
		}
		if a := hs.st.allocSizes(); len(a) != 2 || a[0] != 3*mib || a[1] != 3*mib {
			t.Errorf("allocations %v, want two of 3 MiB", a)
		}
	})
	t.Run("per NUMA node", func(t *testing.T) {
		hs := newHarness(t)
		hs.h.shape = func(h string) ([]store.SlotSize, int, bool) {
			numa := 0
			if h[len(h)-1]%2 == 1 {
				numa = 1
			}
			return []store.SlotSize{{KSize: mib}}, numa, true
		}
		if _, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("numa", 6)); err != nil {
			t.Fatal(err)
		}
		if a := hs.st.allocSizes(); len(a) != 2 || a[0] != 3*mib || a[1] != 3*mib {
			t.Errorf("allocations %v, want one of 3 MiB per NUMA node", a)
		}
	})
}

// TestCoalesce: concurrent prefetches of the same blocks share one fetch.
func TestCoalesce(t *testing.T) {
	hs := newHarness(t)
	release := make(chan struct{})
	var reads atomic.Int64
	hs.cs.r.read = func(ctx context.Context, _ []conn.ReadOp) error {
		reads.Add(1)
		<-release
		return nil
	}
	hs3 := hashes("shared", 3)
	const callers = 8
	results := make([]*Result, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i], errs[i] = hs.e.Prefetch(context.Background(), "peer:1", "ns", hs3)
		}()
	}
	waitFor(t, func() bool { return len(hs.e.InFlight()) == callers && reads.Load() == 1 })
	close(release)
	wg.Wait()
	for i := range callers {
		if errs[i] != nil {
			t.Fatalf("caller %d: %v", i, errs[i])
		}
		for _, b := range results[i].Blocks {
			if b.Status != StatusFetched {
				t.Errorf("caller %d: %v", i, b.Status)
			}
		}
	}
	if n, _, _ := hs.h.counts(); n != 1 || reads.Load() != 1 {
		t.Fatalf("sessions %d reads %d, want one fetch", n, reads.Load())
	}
	hs.h.checkReleasedOnce(t)
}

// TestCoalesceJoinerSeesFailure: a joiner gets the owner's typed error.
func TestCoalesceJoinerSeesFailure(t *testing.T) {
	hs := newHarness(t)
	release := make(chan struct{})
	hs.cs.r.read = func(context.Context, []conn.ReadOp) error {
		<-release
		return fmt.Errorf("%w: injected", conn.ErrConnectionBroken)
	}
	h := hashes("j", 1)
	errs := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", h)
			errs <- err
		}()
	}
	waitFor(t, func() bool { return len(hs.e.InFlight()) == 2 })
	close(release)
	for range 2 {
		if err := <-errs; !errors.Is(err, ErrConnection) {
			t.Errorf("err = %v", err)
		}
	}
	if n, _, _ := hs.h.counts(); n != 1 {
		t.Errorf("sessions = %d", n)
	}
}

// TestStagingHeldUntilReadReturns: docs/lessons.md L9. A cancelled read keeps its
// staging memory until Read returns (the connection flushes first).
func TestStagingHeldUntilReadReturns(t *testing.T) {
	hs := newHarness(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var heldDuringFlush atomic.Bool
	hs.cs.r.read = func(rctx context.Context, ops []conn.ReadOp) error {
		cancel()
		<-rctx.Done()
		// Simulated flush: QPs move to ERROR and drain. Staging memory
		// must still belong to this fetch meanwhile.
		time.Sleep(50 * time.Millisecond)
		held := true
		for _, op := range ops {
			held = held && hs.st.covered(op.LocalAddr, op.Len)
		}
		heldDuringFlush.Store(held)
		return rctx.Err()
	}
	_, err := hs.e.Prefetch(ctx, "peer:1", "ns", hashes("flush", 4))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
	if !heldDuringFlush.Load() {
		t.Fatal("staging memory released before Read returned")
	}
	if u := hs.st.stagingUsed(); u != 0 {
		t.Errorf("staging not returned after Read: %d", u)
	}
	hs.h.checkReleasedOnce(t)
}

// TestReadPanicQuarantinesStaging: a Read that never returns normally
// (panics) may leave QPs writing: the memory is quarantined, not reused.
func TestReadPanicQuarantinesStaging(t *testing.T) {
	hs := newHarness(t)
	hs.cs.r.read = func(context.Context, []conn.ReadOp) error { panic("bug in conn") }
	_, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("q", 2))
	if !errors.Is(err, ErrPanic) {
		t.Fatalf("err = %v", err)
	}
	if u := hs.st.stagingUsed(); u == 0 {
		t.Error("staging memory returned although Read did not return")
	}
	if got := metrics.Value(hs.m.StagingQuarantine); got == 0 {
		t.Error("quarantine gauge not raised")
	}
	hs.h.checkReleasedOnce(t)
	if got := metrics.Value(hs.m.GuardAborts); got != 1 {
		t.Errorf("guard aborts = %v", got)
	}
}

func TestInFlightPhases(t *testing.T) {
	hs := newHarness(t)
	inRead := make(chan struct{})
	release := make(chan struct{})
	hs.cs.r.read = func(context.Context, []conn.ReadOp) error {
		close(inRead)
		<-release
		return nil
	}
	done := make(chan error, 1)
	go func() {
		_, err := hs.e.Prefetch(context.Background(), "peer:9", "ns", hashes("ph", 5))
		done <- err
	}()
	<-inRead
	fi := hs.e.InFlight()
	if len(fi) != 1 || fi[0].Phase != PhaseRead || fi[0].Peer != "peer:9" || fi[0].SessionID == "" ||
		fi[0].Blocks != 5 || fi[0].Bytes != 5*4*4096 || fi[0].ReqID == "" {
		t.Fatalf("in flight = %+v", fi)
	}
	if got := metrics.Value(hs.m.FetchesInFlight); got != 1 {
		t.Errorf("fetches in flight gauge = %v", got)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if fi := hs.e.InFlight(); len(fi) != 0 {
		t.Fatalf("in flight after end = %+v", fi)
	}
}

func TestCloseRejectsNewFetches(t *testing.T) {
	hs := newHarness(t)
	if err := hs.e.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("c", 1)); !errors.Is(err, errClosed) {
		t.Fatalf("err = %v", err)
	}
}

// TestReleaseRetried: a transient release failure is retried; the lock is
// released once and the data kept.
func TestReleaseRetried(t *testing.T) {
	hs := newHarness(t)
	hs.h.releaseErr = func(_ string, attempt int) error {
		if attempt < 3 {
			return status.Error(codes.Unavailable, "hiccup")
		}
		return nil
	}
	if _, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("r", 1)); err != nil {
		t.Fatal(err)
	}
	hs.h.checkReleasedOnce(t)
	if got := metrics.Value(hs.m.GuardReleaseFails); got != 0 {
		t.Errorf("release failures = %v", got)
	}
}

// TestReleaseFailureDiscards: when the release cannot be confirmed, whether
// the lock held is unknown, so nothing is indexed.
func TestReleaseFailureDiscards(t *testing.T) {
	hs := newHarness(t)
	hs.h.releaseErr = func(string, int) error { return status.Error(codes.Internal, "broken") }
	res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("rf", 1))
	if !errors.Is(err, ErrRemote) {
		t.Fatalf("err = %v", err)
	}
	if res.Blocks[0].Status != StatusFailed || hs.st.Has(store.Key{Namespace: "ns", Hash: string(res.Blocks[0].Hash)}) {
		t.Error("block indexed without a confirmed release")
	}
	if got := metrics.Value(hs.m.GuardReleaseFails); got != 1 {
		t.Errorf("release failures = %v", got)
	}
}

// TestBadHolderAnswer: nonsense from the holder is a remote error, and the
// session it did create is still released.
func TestBadHolderAnswer(t *testing.T) {
	hs := newHarness(t)
	hs.h.shape = func(string) ([]store.SlotSize, int, bool) { return []store.SlotSize{{KSize: 0}}, 0, true }
	_, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("bad", 1))
	if !errors.Is(err, ErrRemote) {
		t.Fatalf("err = %v", err)
	}
	hs.h.checkReleasedOnce(t)
}

func TestNewRequiresDependencies(t *testing.T) {
	if _, err := New(Options{}); err == nil {
		t.Fatal("New without dependencies succeeded")
	}
	// Metrics are required too: no private registry the daemon never serves.
	peers := func(string) (pegadv1.PeerServiceClient, error) { return newFakeHolder(), nil }
	if _, err := newEngine(Options{Peers: peers}, nil, nil, hooks{}); err == nil || !strings.Contains(err.Error(), "Metrics is required") {
		t.Fatalf("engine without Metrics: %v, want Metrics is required", err)
	}
	var _ pegadv1.PeerServiceClient = newFakeHolder()
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// TestCoalesceOnlySamePeer: a block in flight from another peer is not
// joined (that peer may not have it): each caller gets its own peer's answer.
func TestCoalesceOnlySamePeer(t *testing.T) {
	lacking := newFakeHolder()
	lacking.shape = func(string) ([]store.SlotSize, int, bool) { return nil, 0, false }
	var hs *harness
	hs = newHarness(t, withOpts(func(o *Options) {
		o.Peers = func(p string) (pegadv1.PeerServiceClient, error) {
			if p == "lacking:1" {
				return lacking, nil
			}
			return hs.h, nil
		}
	}))
	release := make(chan struct{})
	hs.cs.r.read = func(context.Context, []conn.ReadOp) error {
		<-release
		return nil
	}
	h := hashes("p", 1)
	having := make(chan *Result, 1)
	go func() {
		res, _ := hs.e.Prefetch(context.Background(), "having:1", "ns", h)
		having <- res
	}()
	waitFor(t, func() bool { fi := hs.e.InFlight(); return len(fi) == 1 && fi[0].Phase == PhaseRead })
	res, err := hs.e.Prefetch(context.Background(), "lacking:1", "ns", h)
	if err != nil || res.Blocks[0].Status != StatusMissingOnPeer {
		t.Fatalf("lacking peer: %v %v", res.Blocks[0].Status, err)
	}
	close(release)
	if r := <-having; r.Blocks[0].Status != StatusFetched {
		t.Fatalf("having peer: %v %v", r.Blocks[0].Status, r.Blocks[0].Err)
	}
	hs.h.checkReleasedOnce(t)
}
