package conn

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pegaflow/pegad/internal/ibv/tcp"
)

// TestReconnectSparesInFlightRead (issue 14.4): a Read running on a
// connection that is invalidated, followed at once by a new handshake
// with the same holder, finishes: the holder keeps the previous
// generation until its requester disconnects it. Before the fix the new
// handshake destroyed it and the Read failed with RETRY_EXC_ERR.
func TestReconnectSparesInFlightRead(t *testing.T) {
	const qps = 2
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", qps: qps})
	r := newNode(t, d, nodeOpts{id: "req", qps: qps})
	hold.fillRandom(21)
	c1, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	readCheck(t, c1, r, hold, span{0, 0, 64 << 10}) // data connections up
	hold.devs[0].SetFaults(tcp.Faults{ResponseDelay: 300 * time.Millisecond})
	spans := []span{{0, 1 << 20, 256 << 10}, {1 << 20, 0, 256 << 10}}
	errc := make(chan error, 1)
	go func() { errc <- c1.Read(ctxT(t, 10*time.Second), opsOf(r, hold, spans)) }()
	time.Sleep(50 * time.Millisecond) // the Read's requests are being served
	r.dial.Invalidate(c1, errors.New("test: reconnect"))
	c2, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	if got := hold.list(); len(got) != 2 {
		t.Errorf("holder lists %d connections during the drain, want 2 (current and retired): %+v", len(got), got)
	}
	if err := <-errc; err != nil {
		t.Fatalf("in-flight Read across a reconnect: %v", err)
	}
	checkSpans(t, r, hold, spans)
	hold.devs[0].SetFaults(tcp.Faults{})
	// The old generation goes when its requester disconnects it.
	waitFor(t, "retired generation released", func() bool { return hold.nics.QPs() == qps })
	if got := testutil.ToFloat64(hold.met.Conns.WithLabelValues(RoleHolder, StateInvalidated)); got != 0 {
		t.Errorf("holder invalidated gauge = %v, want 0", got)
	}
	readCheck(t, c2, r, hold, span{2 << 20, 12345, 128 << 10})
}

// TestRetiredGenerationDrainBound: a retired generation whose requester
// never disconnects it is destroyed after ReconnectDrain, and counted.
func TestRetiredGenerationDrainBound(t *testing.T) {
	const qps = 2
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", qps: qps, reconnectDrain: 200 * time.Millisecond})
	r := newNode(t, d, nodeOpts{id: "req", qps: qps, disconnectTimeout: 100 * time.Millisecond})
	hold.stallDisconnect.Store(true) // goodbyes never arrive
	c1, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	r.dial.Invalidate(c1, errors.New("test"))
	if _, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "retired generation reaped", func() bool {
		return testutil.ToFloat64(hold.met.AcceptedReaped.WithLabelValues(reapDrained)) == 1
	})
	hold.checkQPs(t, qps)
	if l := hold.list(); len(l) != 1 || l[0].State != StateConnected {
		t.Fatalf("holder lists %+v, want only the current connection", l)
	}
	hold.stallDisconnect.Store(false)
}

// goroutinesIn counts live goroutines with fn on their stack.
func goroutinesIn(fn string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			n++
		}
	}
	return n
}

// TestDeadRequesterReaped (issue 14.3): a requester that goes away without
// a goodbye (its disconnect never arrives, as after kill -9) leaves the
// holder with QPs, their sender goroutines and responders; once its data
// connections are closed and IdleTimeout passes, the holder tears them
// down and counts it. Before the fix they stayed until the same node
// handshook again or the holder shut down.
func TestDeadRequesterReaped(t *testing.T) {
	const qps = 2
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", qps: qps, idleTimeout: 300 * time.Millisecond})
	hold.fillRandom(5)
	senders, responders := goroutinesIn("tcp.(*qp).sender"), goroutinesIn("tcp.(*Device).serve")
	r := newNode(t, d, nodeOpts{id: "req", qps: qps, disconnectTimeout: 100 * time.Millisecond})
	c, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	readCheck(t, c, r, hold, span{0, 0, 512 << 10})
	hold.stallDisconnect.Store(true)
	// The requester dies: its QPs and sockets go, its goodbye does not.
	r.close()
	r.prov.Close()
	hold.checkQPs(t, qps) // nobody told the holder
	waitFor(t, "dead requester's connection reaped", func() bool { return hold.nics.QPs() == 0 })
	hold.checkQPs(t, 0)
	if got := testutil.ToFloat64(hold.met.AcceptedReaped.WithLabelValues(reapIdle)); got != 1 {
		t.Errorf("reaped{idle} = %v, want 1", got)
	}
	if got := holderConns(hold); got != 0 {
		t.Errorf("holder connected gauge = %v, want 0", got)
	}
	waitFor(t, "provider goroutines back to baseline", func() bool {
		return goroutinesIn("tcp.(*qp).sender") == senders && goroutinesIn("tcp.(*Device).serve") == responders
	})
	hold.stallDisconnect.Store(false)
}

// TestLiveIdleRequesterNotReaped: a requester that read once and then
// idles keeps its data connections open, so the holder keeps its side
// however long the idle time is exceeded.
func TestLiveIdleRequesterNotReaped(t *testing.T) {
	const qps = 2
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", qps: qps, idleTimeout: 100 * time.Millisecond})
	r := newNode(t, d, nodeOpts{id: "req", qps: qps})
	hold.fillRandom(6)
	c, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	// One op per QP (round robin), so that every QP dials its connection.
	spans := []span{{0, 0, 64 << 10}, {1 << 20, 1 << 20, 64 << 10}}
	if err := c.Read(ctxT(t, 10*time.Second), opsOf(r, hold, spans)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	hold.checkQPs(t, qps)
	readCheck(t, c, r, hold, span{0, 4096, 64 << 10})
}

// TestUnusedConnectionNotReaped: a connection made and not read through
// yet (a fetch that found nothing) has no data connection at all; the
// holder keeps it past the idle time, so a later Read works.
func TestUnusedConnectionNotReaped(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", idleTimeout: 100 * time.Millisecond})
	r := newNode(t, d, nodeOpts{id: "req"})
	hold.fillRandom(7)
	c, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond)
	hold.checkQPs(t, 1)
	readCheck(t, c, r, hold, span{0, 4096, 64 << 10})
}

// TestAbortCannotHitAnotherBatch (issue 14.5): when a Read aborts (one of
// its batches failed), its batch on another QP that is just finishing must
// not take down the next Read's batch on that QP. Before the fix the abort
// checked "running" and then moved the QP to ERROR without holding
// anything; the hook widens that window: by the time the abort acts,
// Read A's batch has finished and Read B's runs on the QP.
func TestAbortCannotHitAnotherBatch(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2})
	r := newNode(t, d, nodeOpts{id: "req", nics: 2})
	hold.fillRandom(9)
	c, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	op := func(local, remote, n uint64, numa int) ReadOp {
		return ReadOp{LocalAddr: r.base() + local, RemoteAddr: hold.base() + remote, Len: n, NUMA: numa}
	}
	if err := c.Read(ctxT(t, 10*time.Second), []ReadOp{op(0, 0, 4096, 0), op(4096, 4096, 4096, 1)}); err != nil {
		t.Fatal(err) // both NICs' data connections up
	}
	hold.devs[0].SetFaults(tcp.Faults{ResponseDelay: 600 * time.Millisecond})
	hold.devs[1].SetFaults(tcp.Faults{ResponseDelay: 10 * time.Second})
	var aBatch0 *batch
	r.dial.hookAbort = func(bs []*batch) {
		for _, b := range bs {
			if b.s.p.nic == r.nics.curNICs()[0] {
				aBatch0 = b
			}
		}
		// Let A's batch on NIC 0 finish and B's start on the same QP.
		for aBatch0 != nil && aBatch0.state.Load() != batchFinished {
			time.Sleep(time.Millisecond)
		}
		time.Sleep(200 * time.Millisecond)
	}
	errA := make(chan error, 1)
	go func() {
		errA <- c.Read(ctxT(t, 10*time.Second), []ReadOp{op(0, 1<<20, 64<<10, 0), op(1<<20, 0, 64<<10, 1)})
	}()
	time.Sleep(100 * time.Millisecond) // A's batches run
	errB := make(chan error, 1)
	go func() { errB <- c.Read(ctxT(t, 10*time.Second), []ReadOp{op(2<<20, 2<<20, 64<<10, 0)}) }()
	time.Sleep(100 * time.Millisecond) // B's batch queued behind A's on NIC 0
	hold.devs[1].CutConnections()      // A's batch on NIC 1 fails: A aborts
	if err := <-errA; err == nil {
		t.Fatal("Read A succeeded through a cut connection")
	}
	if err := <-errB; err != nil {
		t.Fatalf("Read B failed by Read A's abort: %v", err)
	}
	checkSpans(t, r, hold, []span{{2 << 20, 2 << 20, 64 << 10}})
	hold.devs[0].SetFaults(tcp.Faults{})
	hold.devs[1].SetFaults(tcp.Faults{})
}
