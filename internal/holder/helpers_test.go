package holder

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakePinner pins keys whose hash is in have. It tracks each Pin call's
// slice so a second Unpin of the same pins is caught, and counts pins per
// key so a test can check they balance to zero.
type fakePinner struct {
	mu          sync.Mutex // guards all fields
	have        map[string]bool
	out         map[*(*store.Block)]int // &pinned[0] → len, outstanding
	pinCalls    int
	doubleUnpin int
	panicOnPin  bool
}

func newFakePinner(hashes ...string) *fakePinner {
	f := &fakePinner{have: map[string]bool{}, out: map[*(*store.Block)]int{}}
	for _, h := range hashes {
		f.have[h] = true
	}
	return f
}

func (f *fakePinner) PinChain(_ string, hashes [][]byte) ([]*store.Block, []int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pinCalls++
	if f.panicOnPin {
		panic("fake store exploded")
	}
	var pinned []*store.Block
	var missing []int
	for i, h := range hashes {
		if f.have[string(h)] {
			pinned = append(pinned, new(store.Block))
		} else {
			missing = append(missing, i)
		}
	}
	if len(pinned) > 0 {
		f.out[&pinned[0]] = len(pinned)
	}
	return pinned, missing
}

// pins returns n fresh pinned blocks as if Pin had found them.
func (f *fakePinner) pins(n int) []*store.Block {
	f.mu.Lock()
	defer f.mu.Unlock()
	b := make([]*store.Block, n)
	for i := range b {
		b[i] = new(store.Block)
	}
	f.out[&b[0]] = n
	return b
}

func (f *fakePinner) Unpin(blocks []*store.Block) {
	if len(blocks) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.out[&blocks[0]]; !ok {
		f.doubleUnpin++
		return
	}
	delete(f.out, &blocks[0])
}

// outstanding is the number of blocks pinned and not yet unpinned.
func (f *fakePinner) outstanding() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, c := range f.out {
		n += c
	}
	return n
}

func (f *fakePinner) check(t *testing.T, wantOutstanding int) {
	t.Helper()
	f.mu.Lock()
	d := f.doubleUnpin
	f.mu.Unlock()
	if d != 0 {
		t.Fatalf("%d double unpins", d)
	}
	if got := f.outstanding(); got != wantOutstanding {
		t.Fatalf("outstanding pinned blocks = %d, want %d", got, wantOutstanding)
	}
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu  sync.Mutex // guards now
	now time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.now = t
	c.mu.Unlock()
}

func (c *fakeClock) Advance(d time.Duration) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	return c.now
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex // guards b
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// entries returns the JSON log lines whose message is msg.
func (s *syncBuffer) entries(t *testing.T, msg string) []map[string]any {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(s.b.Bytes()))
	for sc.Scan() {
		var e map[string]any
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			t.Fatalf("bad log line %q: %v", sc.Text(), err)
		}
		if e["message"] == msg {
			out = append(out, e)
		}
	}
	return out
}

// env is a service under test with its fakes.
type env struct {
	svc   *Service
	pins  *fakePinner
	clock *fakeClock
	m     *metrics.Metrics
	logs  *syncBuffer
}

func newEnv(t *testing.T, mod func(*Options), hashes ...string) *env {
	t.Helper()
	e := &env{pins: newFakePinner(hashes...), clock: newFakeClock(), m: metricstest.New(), logs: &syncBuffer{}}
	opts := Options{
		Store: e.pins, Metrics: e.m, Log: zerolog.New(e.logs),
		NodeID: "holder", Incarnation: "h1", LockTimeout: 10 * time.Second,
		MaxLifetime: 25 * time.Second, Now: e.clock.Now,
	}
	if mod != nil {
		mod(&opts)
	}
	e.svc = mustNew(t, opts)
	return e
}

// mustNew is New, failing tb on its error.
func mustNew(tb testing.TB, opts Options) *Service {
	tb.Helper()
	s, err := New(opts)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// open takes a session of n fake blocks directly in the lock table.
func (e *env) open(t *testing.T, owner, inc string, n int) string {
	t.Helper()
	s, err := e.svc.locks.open(owner, inc, e.pins.pins(n), uint64(n)*100)
	if err != nil {
		t.Fatalf("open(%s,%s): %v", owner, inc, err)
	}
	return s.id.String()
}

// client serves e.svc on a loopback listener and returns a client.
func (e *env) client(t *testing.T) pegadv1.PeerServiceClient {
	t.Helper()
	return serve(t, e.svc)
}

func serve(t *testing.T, svc pegadv1.PeerServiceServer) pegadv1.PeerServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(RecoveryInterceptor(zerolog.Nop())))
	pegadv1.RegisterPeerServiceServer(srv, svc)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cc.Close()
		srv.Stop()
		<-done
	})
	return pegadv1.NewPeerServiceClient(cc)
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// state is what "no state change" compares.
type state struct {
	sessions, locked, outstanding        int
	gActive, gLocked, timeouts, renewals float64
	reclaims, force, notLive, pinCalls   float64
}

func (e *env) state() state {
	e.pins.mu.Lock()
	pc := e.pins.pinCalls
	e.pins.mu.Unlock()
	return state{
		sessions: e.svc.locks.Len(), locked: e.svc.locks.LockedBlocks(), outstanding: e.pins.outstanding(),
		gActive: metrics.Value(e.m.SessionsActive), gLocked: metrics.Value(e.m.LockActive),
		timeouts: metrics.Value(e.m.LockTimeouts), renewals: metrics.Value(e.m.LockRenewals),
		reclaims: metrics.Value(e.m.IncarnationReclaim), force: metrics.Value(e.m.LockForceReleases),
		notLive: metrics.Value(e.m.LockEndedNotLive), pinCalls: float64(pc),
	}
}

func (e *env) rpcCount(rpc, code string) float64 {
	return metrics.Value(e.m.HolderRPC.WithLabelValues(rpc, code))
}

func req(node, inc string) *pegadv1.Requester {
	return &pegadv1.Requester{NodeId: node, Incarnation: inc}
}
