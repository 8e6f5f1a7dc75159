package requester

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type harness struct {
	e     *Engine
	h     *fakeHolder
	st    *fakeStore
	cs    *fakeConns
	m     *metrics.Metrics
	log   *testutil.LogBuffer
	hooks hooks
}

type option func(*harness, *Options)

func withHooks(h hooks) option { return func(hs *harness, _ *Options) { hs.hooks = h } }
func withOpts(f func(*Options)) option {
	return func(_ *harness, o *Options) { f(o) }
}

func newHarness(t *testing.T, opts ...option) *harness {
	t.Helper()
	hs := &harness{
		h:   newFakeHolder(),
		st:  newFakeStore(1 << 40),
		cs:  &fakeConns{r: &fakeReader{}},
		m:   metricstest.New(),
		log: &testutil.LogBuffer{},
	}
	o := Options{
		NodeID: "req-node", Incarnation: "inc-1",
		Peers:   func(string) (pegadv1.PeerServiceClient, error) { return hs.h, nil },
		Metrics: hs.m,
		Log:     zerolog.New(hs.log),
	}
	for _, f := range opts {
		f(hs, &o)
	}
	e, err := newEngine(o, hs.st, hs.cs, hs.hooks)
	if err != nil {
		t.Fatal(err)
	}
	hs.e = e
	t.Cleanup(func() { _ = e.Close() })
	return hs
}

func hashes(prefix string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = []byte(fmt.Sprintf("%s-%06d", prefix, i))
	}
	return out
}

func fetchTotal(m *metrics.Metrics, status string) float64 {
	return metrics.Value(m.FetchTotal.WithLabelValues(status))
}

func fetchErrors(m *metrics.Metrics, class string) float64 {
	return metrics.Value(m.FetchErrors.WithLabelValues(class))
}

func TestPrefetchSuccess(t *testing.T) {
	hs := newHarness(t)
	var nops atomic.Int64
	hs.cs.r.read = func(ctx context.Context, ops []conn.ReadOp) error {
		for _, op := range ops {
			if !hs.st.covered(op.LocalAddr, op.Len) {
				return fmt.Errorf("op %+v outside staging", op)
			}
		}
		nops.Store(int64(len(ops)))
		return nil
	}
	hs.h.shape = func(hash string) ([]store.SlotSize, int, bool) {
		if strings.HasSuffix(hash, "3") {
			return []store.SlotSize{{KSize: 1000}}, 0, true // contiguous, unaligned
		}
		return []store.SlotSize{{KSize: 4096, VSize: 100}, {KSize: 4096, VSize: 100}}, 0, true
	}
	hs4 := hashes("ok", 4)
	hs4 = append(hs4, hs4[0]) // a duplicate in the request
	res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hs4)
	if err != nil {
		t.Fatal(err)
	}
	for i, b := range res.Blocks {
		if b.Status != StatusFetched || b.Err != nil {
			t.Errorf("block %d: %v %v", i, b.Status, b.Err)
		}
	}
	if want := uint64(3*(2*4196) + 1000); res.Bytes != want {
		t.Errorf("bytes = %d, want %d", res.Bytes, want)
	}
	if nops.Load() != 3*4+1 {
		t.Errorf("read ops = %d, want 13 (one per K and V segment)", nops.Load())
	}
	if res.SessionID == "" || res.ReqID == "" {
		t.Errorf("result lacks session/req id: %+v", res)
	}
	hs.h.checkReleasedOnce(t)
	hs.st.check(t)
	if hs.st.stagingUsed() != 0 {
		t.Errorf("staging bytes left: %d", hs.st.stagingUsed())
	}

	// Again: everything is local now, nothing is asked of the holder.
	res, err = hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("ok", 4))
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range res.Blocks {
		if b.Status != StatusAlreadyLocal {
			t.Errorf("second prefetch: %v", b.Status)
		}
	}
	if n, _, _ := hs.h.counts(); n != 1 {
		t.Errorf("holder sessions = %d, want 1", n)
	}
	if got := fetchTotal(hs.m, metrics.FetchOK); got != 2 {
		t.Errorf("fetch_total{ok} = %v", got)
	}
	if got := metrics.Value(hs.m.FetchBytes); got != float64(3*(2*4196)+1000) {
		t.Errorf("fetch bytes = %v", got)
	}
	if got := metrics.Value(hs.m.GuardAborts); got != 0 {
		t.Errorf("guard aborts = %v", got)
	}
	if got := metrics.Value(hs.m.FetchesInFlight); got != 0 {
		t.Errorf("in flight gauge = %v", got)
	}
}

// TestGuardExactlyOnce: every exit of a fetch releases its lock exactly
// once; only the abnormal exits go through the guard's abort path.
func TestGuardExactlyOnce(t *testing.T) {
	type tc struct {
		name      string
		hookPhase string // panic when entering this phase
		read      func(ctx context.Context, ops []conn.ReadOp) error
		cancelIn  bool // cancel the caller's ctx from inside Read
		closeIn   bool // Close the engine from inside Read
		wantErr   error
		wantAbort float64
		wantTotal string
	}
	boom := fmt.Errorf("%w: injected", conn.ErrConnectionBroken)
	cases := []tc{
		{name: "success", wantAbort: 0, wantTotal: metrics.FetchOK},
		{name: "read error", read: func(context.Context, []conn.ReadOp) error { return boom },
			wantErr: ErrConnection, wantAbort: 0, wantTotal: metrics.FetchError},
		{name: "panic in stage", hookPhase: PhaseStage, wantErr: ErrPanic, wantAbort: 1, wantTotal: metrics.FetchPanic},
		{name: "panic in read", hookPhase: PhaseRead, wantErr: ErrPanic, wantAbort: 1, wantTotal: metrics.FetchPanic},
		{name: "panic before release", hookPhase: PhaseRelease, wantErr: ErrPanic, wantAbort: 1, wantTotal: metrics.FetchPanic},
		{name: "panic after release", hookPhase: PhaseIndex, wantErr: ErrPanic, wantAbort: 0, wantTotal: metrics.FetchPanic},
		{name: "cancel mid-read", cancelIn: true, wantErr: context.Canceled, wantAbort: 1, wantTotal: metrics.FetchCanceled},
		{name: "shutdown mid-read", closeIn: true, wantErr: errClosed, wantAbort: 1, wantTotal: metrics.FetchCanceled},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			hs := newHarness(t, withHooks(hooks{phase: func(_ context.Context, _, phase string) {
				if phase == c.hookPhase {
					panic("injected panic in " + phase)
				}
			}}))
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			closed := make(chan struct{})
			hs.cs.r.read = func(rctx context.Context, ops []conn.ReadOp) error {
				switch {
				case c.cancelIn:
					cancel()
					<-rctx.Done()
					return rctx.Err()
				case c.closeIn:
					go func() { _ = hs.e.Close(); close(closed) }()
					<-rctx.Done()
					return rctx.Err()
				case c.read != nil:
					return c.read(rctx, ops)
				}
				return nil
			}
			_, err := hs.e.Prefetch(ctx, "peer:1", "ns", hashes(c.name, 3))
			if c.wantErr == nil && err != nil || c.wantErr != nil && !errors.Is(err, c.wantErr) {
				t.Fatalf("err = %v, want %v", err, c.wantErr)
			}
			if c.closeIn {
				<-closed
			}
			hs.h.checkReleasedOnce(t)
			if n, _, _ := hs.h.counts(); n != 1 {
				t.Fatalf("sessions = %d, want 1", n)
			}
			if got := metrics.Value(hs.m.GuardAborts); got != c.wantAbort {
				t.Errorf("guard aborts = %v, want %v", got, c.wantAbort)
			}
			if got := fetchTotal(hs.m, c.wantTotal); got != 1 {
				t.Errorf("fetch_total{%s} = %v, want 1", c.wantTotal, got)
			}
			if c.wantAbort > 0 {
				logs := hs.log.String()
				for _, key := range []string{`"level":"warn"`, `"session":"s-1"`, `"remote":"peer:1"`, `"req_id":`} {
					if !strings.Contains(logs, key) {
						t.Errorf("abort WARN lacks %s: %s", key, logs)
					}
				}
			}
			hs.st.check(t)
			if c.hookPhase != PhaseIndex && c.wantErr != nil && hs.st.stagingUsed() != 0 {
				t.Errorf("staging left after failure: %d", hs.st.stagingUsed())
			}
		})
	}
}

type ctxKey struct{}

// TestRandomFaults runs thousands of fetches with random injected faults
// (cancel, panic, holder error, transport error) and checks that the holder
// ends with query ok == release ok and every session released once.
func TestRandomFaults(t *testing.T) {
	const n = 3000
	var seq atomic.Int64
	phases := []string{PhaseConnect, PhaseLock, PhaseStage, PhaseRead, PhaseRelease, PhaseIndex}
	// fault decided per req_id; derived from a counter so the mix is even.
	type fault struct {
		kind  int
		phase string
	}
	var faultsMu sync.Mutex
	faults := map[string]fault{}
	pick := func(reqID string) fault {
		faultsMu.Lock()
		defer faultsMu.Unlock()
		f, ok := faults[reqID]
		if !ok {
			i := seq.Add(1)
			f = fault{kind: int(i % 7), phase: phases[(i/7)%int64(len(phases))]}
			faults[reqID] = f
		}
		return f
	}
	hs := newHarness(t, withHooks(hooks{phase: func(ctx context.Context, reqID, phase string) {
		f := pick(reqID)
		switch {
		case f.kind == 1 && f.phase == phase:
			panic("injected")
		case f.kind == 2 && f.phase == phase:
			ctx.Value(ctxKey{}).(context.CancelFunc)()
		}
	}}))
	var qn atomic.Int64
	hs.h.queryErr = func() error {
		if qn.Add(1)%11 == 0 {
			return status.Error(codes.Unavailable, "injected holder error")
		}
		return nil
	}
	hs.h.releaseErr = func(sid string, attempt int) error {
		if attempt == 1 && len(sid)%3 == 0 {
			return status.Error(codes.Unavailable, "injected release hiccup")
		}
		return nil
	}
	var rn atomic.Int64
	hs.cs.r.read = func(ctx context.Context, ops []conn.ReadOp) error {
		switch rn.Add(1) % 9 {
		case 0:
			return fmt.Errorf("%w: injected", conn.ErrConnectionBroken)
		case 1:
			return fmt.Errorf("%w: injected", conn.ErrSessionInvalidated)
		}
		return nil
	}
	var wg sync.WaitGroup
	work := make(chan int)
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				ctx, cancel := context.WithCancel(context.Background())
				// The hook sees a context derived from this one.
				ctx = context.WithValue(ctx, ctxKey{}, cancel)
				_, err := hs.e.Prefetch(ctx, "peer:1", "ns", hashes(fmt.Sprint("rf", i), 1+i%4))
				if err != nil {
					var fe *FetchError
					if !errors.As(err, &fe) {
						t.Errorf("untyped error %v", err)
					}
				}
				cancel()
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	hs.h.checkReleasedOnce(t)
	hs.st.check(t)
	sessions, rel, _ := hs.h.counts()
	t.Logf("sessions %d, release ok %d, aborts %v, panics %v, canceled %v, errors %v, ok %v", sessions, rel,
		metrics.Value(hs.m.GuardAborts), fetchTotal(hs.m, metrics.FetchPanic),
		fetchTotal(hs.m, metrics.FetchCanceled), fetchTotal(hs.m, metrics.FetchError), fetchTotal(hs.m, metrics.FetchOK))
	if fetchTotal(hs.m, metrics.FetchPanic) == 0 || fetchTotal(hs.m, metrics.FetchCanceled) == 0 ||
		fetchTotal(hs.m, metrics.FetchError) == 0 || fetchTotal(hs.m, metrics.FetchOK) == 0 {
		t.Error("fault mix did not exercise every outcome")
	}
	if len(hs.e.InFlight()) != 0 || metrics.Value(hs.m.FetchesInFlight) != 0 {
		t.Error("fetches still in flight")
	}
}
