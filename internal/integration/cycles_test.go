package integration

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
)

// TestDaemonConnectInvalidateCycles: 1,000 connect/invalidate cycles
// between two daemons (each a RdmaHandshake over the peer port, QPs on both
// sides, session workers on the requester), with a prefetch every few
// cycles. Afterwards the requester has no QP or session worker left, nor
// does the holder (each invalidation sent an RdmaDisconnect for its
// handshake; a late one never removed a newer connection, or the fetches
// would break), and the process's goroutines are back to their baseline
// (goleak checks the rest after the daemons close).
func TestDaemonConnectInvalidateCycles(t *testing.T) {
	const (
		ns     = "cycles"
		nics   = 2
		qps    = 2
		cycles = 1000
		par    = 4
	)
	cycleCount := cycles
	if testing.Short() {
		cycleCount = 200
	}
	rng := rand.New(rand.NewPCG(5, 5))
	hc := baseConfig(t, "holder")
	hc.NICs = fmt.Sprint(nics)
	h := start(t, hc)
	blocks := randomBlocks(rng, "c", par, 1<<10, 64<<10)
	putAll(t, h, ns, blocks)
	rc := baseConfig(t, "requester")
	rc.NICs = fmt.Sprint(nics)
	rc.QPsPerPeer = qps
	r := start(t, rc)
	ctx := ctxT(t, 120*time.Second)
	peer := h.d.PeerAddr()

	// Baseline: both daemons up, the gRPC channels between them open, no
	// RDMA connection.
	if _, err := prefetch(ctx, r, peer, ns, []byte("absent")); err != nil {
		t.Fatal(err)
	}
	c, err := r.d.Dialer().Get(ctx, peer)
	if err != nil {
		t.Fatal(err)
	}
	r.d.Dialer().Invalidate(c, errors.New("test: baseline"))
	eventually(t, "baseline without QPs", 10*time.Second, func() error {
		if q := r.d.Conns().QPs(); q != 0 {
			return fmt.Errorf("%d QPs", q)
		}
		return nil
	})
	runtime.GC()
	base := runtime.NumGoroutine()

	began := time.Now()
	var okFetches, brokenFetches atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, par)
	for g := range par {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range cycleCount / par {
				if i%25 == 0 {
					b := blocks[g]
					resp, err := prefetch(ctx, r, peer, ns, b.hash)
					switch {
					case err != nil && status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "connection broken"):
						// Another goroutine invalidated the connection under
						// this fetch: a connection-class failure is the one
						// acceptable outcome.
						brokenFetches.Add(1)
					case err != nil:
						errs <- fmt.Errorf("cycle %d: prefetch: %w", i, err)
						return
					case resp.GetBlocks()[0].GetStatus() == statusFetched:
						okFetches.Add(1)
						got, err := get(ctx, r, ns, b.hash)
						if err != nil || !bytes.Equal(got, b.body) {
							errs <- fmt.Errorf("cycle %d: block %s: %d bytes, %v", i, b.hash, len(got), err)
							return
						}
						if _, err := r.local.DeleteBlock(ctx, &pegadv1.DeleteBlockRequest{Namespace: ns, Hash: b.hash}); err != nil {
							errs <- err
							return
						}
					}
				}
				c, err := r.d.Dialer().Get(ctx, peer)
				if err != nil {
					errs <- fmt.Errorf("cycle %d: connect: %w", i, err)
					return
				}
				r.d.Dialer().Invalidate(c, errors.New("test: cycle"))
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}
	took := time.Since(began)

	// After all that, a fetch on a fresh connection works.
	b := blocks[0]
	_, _ = r.local.DeleteBlock(ctx, &pegadv1.DeleteBlockRequest{Namespace: ns, Hash: b.hash})
	resp, err := prefetch(ctx, r, peer, ns, b.hash)
	if err != nil || resp.GetBlocks()[0].GetStatus() != statusFetched {
		t.Fatalf("prefetch after the cycles: %v, %v", resp, err)
	}
	if got, err := get(ctx, r, ns, b.hash); err != nil || !bytes.Equal(got, b.body) {
		t.Fatalf("block after the cycles: %d bytes, %v", len(got), err)
	}
	if c, err := r.d.Dialer().Get(ctx, peer); err != nil {
		t.Fatal(err)
	} else {
		r.d.Dialer().Invalidate(c, errors.New("test: done"))
	}

	eventually(t, "requester QPs and workers drained", 15*time.Second, func() error {
		m := r.cn.Scrape(t)
		if m[mRDMAQPs] != 0 || m[mSessionWorkers] != 0 || r.d.Conns().QPs() != 0 {
			return fmt.Errorf("%s=%v %s=%v", mRDMAQPs, m[mRDMAQPs], mSessionWorkers, m[mSessionWorkers])
		}
		return nil
	})
	eventually(t, "holder released every accepted connection", 15*time.Second, func() error {
		m := h.cn.Scrape(t)
		cs, err := h.admin.ListConns(ctx, &pegadv1.ListConnsRequest{})
		if err != nil {
			return err
		}
		if m[mRDMAQPs] != 0 || len(cs.GetConns()) != 0 {
			return fmt.Errorf("holder %s=%v with %d connections listed", mRDMAQPs, m[mRDMAQPs], len(cs.GetConns()))
		}
		// One disconnect per connection the holder accepted.
		if acc := m[`pegaflow_rdma_handshakes_total{result="ok",role="holder"}`]; m[mDisconnectOK] != acc {
			return fmt.Errorf("holder served %v disconnects for %v accepted handshakes", m[mDisconnectOK], acc)
		}
		return nil
	})
	eventually(t, "goroutines back to baseline", 15*time.Second, func() error {
		runtime.GC()
		if n := runtime.NumGoroutine(); n > base {
			return fmt.Errorf("%d goroutines, baseline %d", n, base)
		}
		return nil
	})
	var handshakes float64
	for k, v := range h.cn.Scrape(t) {
		if k == `pegaflow_rdma_handshakes_total{result="ok",role="holder"}` {
			handshakes = v
		}
	}
	// Each goroutine invalidates the connection it got before asking again,
	// so it sees a new connection every cycle (concurrent goroutines may
	// share one handshake).
	if handshakes < float64(cycleCount/par) {
		t.Errorf("holder accepted %v handshakes, want at least %d", handshakes, cycleCount/par)
	}
	if okFetches.Load() == 0 {
		t.Error("no prefetch succeeded between the cycles")
	}
	t.Logf("%d connect/invalidate cycles (%v handshakes accepted) in %v, %d prefetches ok, %d broken by a concurrent invalidation; goroutines back to %d",
		cycleCount, handshakes, took.Round(time.Millisecond), okFetches.Load(), brokenFetches.Load(), base)
}

// TestSlowResponderWithinRetryBudget: a holder whose data device answers
// every READ a whole second late (a host stalled by load) is slow, not
// dead: the fetch succeeds and the connection stays up, because pegad gives
// tcp QPs a retry budget of ≈4 s. With the verbs default (≈0.5 s) the READ
// would fail with RETRY_EXC_ERR and the connection would be invalidated.
func TestSlowResponderWithinRetryBudget(t *testing.T) {
	const ns = "slow"
	rng := rand.New(rand.NewPCG(6, 6))
	hc := baseConfig(t, "holder")
	hc.LockTimeout = 10 * time.Second
	h := start(t, hc)
	bs := randomBlocks(rng, "s", 2, 10<<10, 100<<10)
	putAll(t, h, ns, bs)
	r := start(t, baseConfig(t, "requester"))
	ctx := ctxT(t, 60*time.Second)

	if _, err := prefetch(ctx, r, h.d.PeerAddr(), ns, bs[0].hash); err != nil { // connect first
		t.Fatal(err)
	}
	for _, d := range h.d.TCPDevices() {
		d.SetFaults(tcp.Faults{ResponseDelay: time.Second})
	}
	began := time.Now()
	resp, err := prefetch(ctx, r, h.d.PeerAddr(), ns, bs[1].hash)
	took := time.Since(began)
	for _, d := range h.d.TCPDevices() {
		d.SetFaults(tcp.Faults{})
	}
	if err != nil {
		t.Fatalf("prefetch from a holder answering 1 s late: %v", err)
	}
	if resp.GetBlocks()[0].GetStatus() != statusFetched || took < time.Second {
		t.Fatalf("block %v after %v: want fetched, no sooner than the injected delay", resp.GetBlocks()[0], took)
	}
	got, err := get(ctx, r, ns, bs[1].hash)
	if err != nil || !bytes.Equal(got, bs[1].body) {
		t.Fatalf("block: %d bytes, %v", len(got), err)
	}
	for k, v := range r.cn.Scrape(t) {
		if v != 0 && strings.HasPrefix(k, `pegaflow_rdma_connection_invalidations_total`) {
			t.Fatalf("connection invalidated by a slow responder: %s = %v", k, v)
		}
	}
	cs := r.d.Conns().List()
	if len(cs) != 1 || cs[0].State != conn.StateConnected {
		t.Fatalf("requester connections %+v, want the one connection still up", cs)
	}
	t.Logf("fetch through a 1 s response delay took %v", took.Round(time.Millisecond))
}
