package daemon_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ctl"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/requester"
)

// readGate blocks every fetch as it enters the read phase (its lock granted
// on the holder) until open is closed or the fetch's context ends.
type readGate struct {
	open    chan struct{}
	reached chan struct{} // closed when the first fetch is held
	once    sync.Once
}

func newReadGate() *readGate {
	return &readGate{open: make(chan struct{}), reached: make(chan struct{})}
}

func (g *readGate) option() daemon.Option {
	return daemon.WithRequesterFaults(func(ctx context.Context, _, phase string) {
		if phase != requester.PhaseRead {
			return
		}
		g.once.Do(func() { close(g.reached) })
		select {
		case <-g.open:
		case <-ctx.Done():
		}
	})
}

// heldFetch starts a prefetch of block {1} from holder on req and waits
// until it holds a lock on holder, blocked by gate before its reads.
func heldFetch(t *testing.T, holder, req *node, gate *readGate) <-chan prefetchResult {
	t.Helper()
	putBlock(t, holder, "ns", []byte{1}, pattern(1<<20+7, 1), false)
	done := make(chan prefetchResult, 1)
	go func() {
		resp, err := req.local.Prefetch(context.Background(), &pegadv1.PrefetchRequest{
			Peer: holder.d.PeerAddr(), Namespace: "ns", Hashes: [][]byte{{1}}})
		done <- prefetchResult{resp, err}
	}()
	select {
	case <-gate.reached:
	case r := <-done:
		t.Fatalf("prefetch ended before its read: %v %v", r.resp, r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("prefetch never reached its read")
	}
	return done
}

type prefetchResult struct {
	resp *pegadv1.PrefetchResponse
	err  error
}

// closeAsync starts n's shutdown (as SIGTERM does) and returns its result.
func closeAsync(n *node) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- n.d.Close() }()
	return ch
}

func healthz(t *testing.T, addr string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatalf("/healthz during drain: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

func wantDraining(t *testing.T, what string, err error) {
	t.Helper()
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), daemon.DrainingMessage) {
		t.Fatalf("%s during drain: %v, want UNAVAILABLE %q", what, err, daemon.DrainingMessage)
	}
}

func notReturned(t *testing.T, closed <-chan error) {
	t.Helper()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while work was in flight", err)
	default:
	}
}

// TestDrainRequesterFinishesFetch: SIGTERM on a requester with a fetch in
// flight. The socket and /metrics stay up, /healthz answers 503 draining,
// a new prefetch is refused with UNAVAILABLE draining, the log says what
// the drain waits for; the fetch completes, its lock is released, and the
// shutdown returns nil (exit 0).
func TestDrainRequesterFinishesFetch(t *testing.T) {
	gate := newReadGate()
	a := startNode(t, testConfig(t))
	b := startNode(t, testConfig(t), gate.option())
	fetched := heldFetch(t, a, b, gate)

	closed := closeAsync(b)
	eventually(t, "drain begins", 5*time.Second, func() bool { return b.d.Draining() })
	if code, body := healthz(t, b.d.MetricsAddr()); code != http.StatusServiceUnavailable || body != daemon.DrainingMessage {
		t.Fatalf("/healthz during drain: %d %q, want 503 %q", code, body, daemon.DrainingMessage)
	}
	if _, err := b.admin.Stats(ctxT(t), &pegadv1.StatsRequest{}); err != nil {
		t.Fatalf("local socket during drain: %v", err)
	}
	if v := metric(t, b.d.MetricsAddr(), "pegaflow_rdma_fetches_in_flight"); v != 1 {
		t.Fatalf("/metrics during drain: fetches in flight %v, want 1", v)
	}
	_, err := b.local.Prefetch(ctxT(t), &pegadv1.PrefetchRequest{Peer: a.d.PeerAddr(), Namespace: "ns", Hashes: [][]byte{{2}}})
	wantDraining(t, "new prefetch", err)
	eventually(t, "drain log", 5*time.Second, func() bool {
		return strings.Contains(b.logs.String(), "Draining: waiting for a fetch to finish")
	})
	notReturned(t, closed)

	close(gate.open)
	r := <-fetched
	if r.err != nil || r.resp.GetBlocks()[0].GetStatus() != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED {
		t.Fatalf("fetch in flight at SIGTERM: %v %v", r.resp, r.err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if n := a.d.HolderSessions(); n != 0 {
		t.Fatalf("holder still has %d sessions after the requester drained", n)
	}
}

// TestDrainHolderServesGrantedSession: SIGTERM on a holder while a peer
// holds a session on it. New sessions are refused with UNAVAILABLE
// draining; the granted session's reads are served, the peer releases it,
// and the holder's shutdown ends then, before shutdown-timeout, with nil.
func TestDrainHolderServesGrantedSession(t *testing.T) {
	gate := newReadGate()
	acfg := testConfig(t)
	acfg.ShutdownTimeout = 20 * time.Second
	a := startNode(t, acfg)
	b := startNode(t, testConfig(t), gate.option())
	fetched := heldFetch(t, a, b, gate)
	want := pattern(1<<20+7, 1)

	start := time.Now()
	closed := closeAsync(a)
	eventually(t, "drain begins", 5*time.Second, func() bool { return a.d.Draining() })
	if code, _ := healthz(t, a.d.MetricsAddr()); code != http.StatusServiceUnavailable {
		t.Fatalf("/healthz during drain: %d, want 503", code)
	}
	_, err := a.peer.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{{1}}, Requester: &pegadv1.Requester{NodeId: "other", Incarnation: "i"}})
	wantDraining(t, "new session", err)
	// A handoff could not be pulled from a node refusing new sessions.
	_, err = a.local.Handoff(ctxT(t), &pegadv1.HandoffRequest{Namespace: "ns", Hashes: [][]byte{{1}}})
	wantDraining(t, "new handoff", err)
	eventually(t, "drain log", 5*time.Second, func() bool {
		return strings.Contains(a.logs.String(), "Draining: waiting for peers to release their sessions")
	})
	notReturned(t, closed)

	close(gate.open)
	r := <-fetched
	if r.err != nil || r.resp.GetBlocks()[0].GetStatus() != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED {
		t.Fatalf("read of a granted session during the holder's drain: %v %v\nA logs:\n%s", r.resp, r.err, a.logs)
	}
	if got := getBlock(t, b, "ns", []byte{1}); !bytes.Equal(got, want) {
		t.Fatal("block fetched during the holder's drain differs")
	}
	if err := <-closed; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if el := time.Since(start); el > acfg.ShutdownTimeout/2 {
		t.Fatalf("holder drained in %v: it waited past the release", el)
	}
	if strings.Contains(a.logs.String(), "Released holder sessions at shutdown") {
		t.Fatal("the session was force-ended at shutdown, not released by its requester")
	}
}

// TestDrainTimeoutAbortsFetch: a fetch that outlives shutdown-timeout is
// aborted; the prefetch answers with its per-block results (what pegactl
// prints) and a reason, the guard releases the holder's lock at once (not
// at lock-timeout), and the shutdown still returns nil.
func TestDrainTimeoutAbortsFetch(t *testing.T) {
	gate := newReadGate()
	acfg := testConfig(t)
	acfg.LockTimeout = time.Minute
	a := startNode(t, acfg)
	bcfg := testConfig(t)
	bcfg.ShutdownTimeout = 400 * time.Millisecond
	b := startNode(t, bcfg, gate.option())
	fetched := heldFetch(t, a, b, gate)

	if err := b.d.Close(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	r := <-fetched
	if r.err == nil {
		t.Fatalf("aborted fetch succeeded: %v", r.resp)
	}
	st := status.Convert(r.err)
	if st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "shut down") || strings.Contains(st.Message(), "\n") {
		t.Fatalf("aborted fetch's reason: %v, want one line, UNAVAILABLE, naming the shutdown", r.err)
	}
	var detail *pegadv1.PrefetchResponse
	for _, d := range st.Details() {
		if p, ok := d.(*pegadv1.PrefetchResponse); ok {
			detail = p
		}
	}
	if detail == nil || len(detail.GetBlocks()) != 1 ||
		detail.GetBlocks()[0].GetStatus() != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED {
		t.Fatalf("aborted fetch has no per-block results: %v", r.err)
	}
	eventually(t, "guard releases the holder's lock", 5*time.Second, func() bool { return a.d.HolderSessions() == 0 })
	if !strings.Contains(b.logs.String(), "Shutdown timeout: aborting") {
		t.Fatalf("no log line for the abort:\n%s", b.logs)
	}
}

// TestWatchdogStopsWhenUnhealthy: pings stop once a server is down.
func TestWatchdogStopsWhenUnhealthy(t *testing.T) {
	t.Setenv("WATCHDOG_USEC", "60000")
	t.Setenv("WATCHDOG_PID", strconv.Itoa(os.Getpid()))
	var pings atomic.Int64
	d := startNode(t, testConfig(t), daemon.WithNotify(func(s string) {
		if s == "WATCHDOG=1" {
			pings.Add(1)
		}
	})).d
	eventually(t, "watchdog ping", 5*time.Second, func() bool { return pings.Load() > 0 })
	d.StopPeerServer() // the peer gRPC server dies under a running daemon
	eventually(t, "unhealthy", 5*time.Second, func() bool { return d.Unhealthy(time.Now()) != "" })
	time.Sleep(150 * time.Millisecond) // a ping already past its check may land
	n := pings.Load()
	time.Sleep(300 * time.Millisecond) // ten ping intervals
	if got := pings.Load(); got != n {
		t.Fatalf("watchdog pinged %d times with the peer server down", got-n)
	}
}

// TestDrainTimeoutPegactlPrefetch: `pegactl prefetch` cut short by a
// shutdown prints its per-block results and a one-line reason, and exits
// with the retryable "unavailable" code (not a raw transport error).
func TestDrainTimeoutPegactlPrefetch(t *testing.T) {
	gate := newReadGate()
	a := startNode(t, testConfig(t))
	bcfg := testConfig(t)
	bcfg.ShutdownTimeout = 400 * time.Millisecond
	b := startNode(t, bcfg, gate.option())
	putBlock(t, a, "ns", []byte{1}, pattern(4096, 1), false)

	var stdout, stderr bytes.Buffer
	code := make(chan int, 1)
	go func() {
		code <- ctl.Main(context.Background(), []string{"--socket", b.d.SocketPath(),
			"prefetch", "--peer", a.d.PeerAddr(), "--namespace", "ns", "01"},
			ctl.Streams{In: strings.NewReader(""), Out: &stdout, Err: &stderr})
	}()
	select {
	case <-gate.reached:
	case c := <-code:
		t.Fatalf("pegactl prefetch ended (%d) before its read: %s%s", c, stdout.String(), stderr.String())
	case <-time.After(10 * time.Second):
		t.Fatal("prefetch never reached its read")
	}
	if err := b.d.Close(); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if c := <-code; c != ctl.ExitUnavailable {
		t.Fatalf("pegactl exit %d, want %d (unavailable)\nstdout:\n%s\nstderr:\n%s", c, ctl.ExitUnavailable, stdout.String(), stderr.String())
	}
	if lines := strings.Split(strings.TrimSpace(stderr.String()), "\n"); len(lines) != 1 ||
		!strings.Contains(lines[0], "pegad shut down before the fetch finished") {
		t.Fatalf("pegactl's reason: %q, want one line naming the shutdown", stderr.String())
	}
	t.Logf("pegactl prefetch cut short by a shutdown:\n%s%s", stdout.String(), stderr.String())
	if !strings.Contains(stdout.String(), "01") || !strings.Contains(stdout.String(), "failed") {
		t.Fatalf("pegactl printed no per-block result:\n%s", stdout.String())
	}
}
