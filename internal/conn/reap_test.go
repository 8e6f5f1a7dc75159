package conn

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
)

// TestRequesterGoneBeforeFirstReadReaped (review finding): a requester
// that handshook and died before its first READ, without a goodbye, left
// the holder's side of the connection for good: the reaper only looked at
// connections whose data connections had been used. Now a live requester
// dials them right after the handshake (Prewarm) and the reaper frees any
// connection with none open for the idle time.
func TestRequesterGoneBeforeFirstReadReaped(t *testing.T) {
	cases := []struct {
		name string
		// handshake makes the holder accept a connection from a requester
		// that then dies without a disconnect.
		handshake func(t *testing.T, d *dialers, hold *node)
	}{
		{"requester killed after its handshake", func(t *testing.T, d *dialers, hold *node) {
			r := newNode(t, d, nodeOpts{id: "req", qps: 2, disconnectTimeout: 100 * time.Millisecond})
			if _, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr); err != nil {
				t.Fatal(err)
			}
			hold.stallDisconnect.Store(true)
			t.Cleanup(func() { hold.stallDisconnect.Store(false) })
			r.close()
			r.prov.Close()
		}},
		{"requester gone before any data connection", func(t *testing.T, _ *dialers, hold *node) {
			ep := &pegadv1.Endpoint{Qpn: 0x100, Psn: 7, Addr: "127.0.0.1:9"}
			req := &pegadv1.RdmaHandshakeRequest{
				Requester: &pegadv1.Requester{NodeId: "req", Incarnation: "i"}, Transport: "tcp", HandshakeId: "hs",
				Nics: []*pegadv1.NicHandshake{{Nic: "n", Endpoints: []*pegadv1.Endpoint{ep, ep}}},
			}
			if _, err := hold.acc.Accept(context.Background(), req); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDialers(t)
			hold := newNode(t, d, nodeOpts{id: "holder", qps: 2, idleTimeout: 200 * time.Millisecond})
			tc.handshake(t, d, hold)
			hold.checkQPs(t, 2)
			waitFor(t, "connection of the gone requester reaped", func() bool { return hold.nics.QPs() == 0 })
			if got := testutil.ToFloat64(hold.met.AcceptedReaped.WithLabelValues(reapIdle)); got != 1 {
				t.Errorf("reaped{idle} = %v, want 1", got)
			}
			if got := holderConns(hold); got != 0 {
				t.Errorf("holder connected gauge = %v, want 0", got)
			}
		})
	}
}

// TestLiveUnusedRequesterKeepsDataConnections: right after its handshake,
// before any READ, a live requester holds a data connection open on every
// QP, so the holder never finds it idle.
func TestLiveUnusedRequesterKeepsDataConnections(t *testing.T) {
	const qps = 3
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", qps: qps, idleTimeout: 100 * time.Millisecond})
	r := newNode(t, d, nodeOpts{id: "req", qps: qps})
	if _, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr); err != nil {
		t.Fatal(err)
	}
	waitDataOpen(t, hold, "req")
	time.Sleep(400 * time.Millisecond)
	hold.checkQPs(t, qps)
}

// waitDataOpen waits until every holder-side QP of node's accepted
// connection has a data connection open.
func waitDataOpen(t *testing.T, hold *node, node string) {
	t.Helper()
	hold.acc.mu.Lock()
	a := hold.acc.accepted[node]
	hold.acc.mu.Unlock()
	if a == nil {
		t.Fatalf("no accepted connection from %s", node)
	}
	waitFor(t, "a data connection open on every holder QP", func() bool {
		for _, qs := range a.nics {
			for _, p := range qs {
				if open, _, _ := p.qp.(activityReporter).DataActivity(); open == 0 {
					return false
				}
			}
		}
		return true
	})
}

// activityGate makes DataActivity of the QPs it wraps block while armed:
// a QP whose lock is held by a slow provider call.
type activityGate struct {
	armed   atomic.Bool
	once    sync.Once
	entered chan struct{} // closed when a call first blocks
	release chan struct{} // closing it lets every call through
}

type gatedQP struct {
	ibv.QP
	g *activityGate
}

func (q gatedQP) DataActivity() (int, time.Time, bool) {
	if q.g.armed.Load() {
		q.g.once.Do(func() { close(q.g.entered) })
		<-q.g.release
	}
	return q.QP.(activityReporter).DataActivity()
}

type gatedDevice struct {
	ibv.Device
	g *activityGate
}

func (d gatedDevice) AllocPD() (ibv.PD, error) {
	pd, err := d.Device.AllocPD()
	if err != nil {
		return nil, err
	}
	return gatedPD{PD: pd, g: d.g}, nil
}

type gatedPD struct {
	ibv.PD
	g *activityGate
}

func (p gatedPD) CreateQP(cq ibv.CQ, c ibv.QPCap) (ibv.QP, error) {
	qp, err := p.PD.CreateQP(cq, c)
	if err != nil {
		return nil, err
	}
	return gatedQP{QP: qp, g: p.g}, nil
}

// TestReapDoesNotHoldManagerOverQPLocks (review finding): the reaper took
// every accepted QP's lock (DataActivity) while holding the manager's
// mutex, so one QP lock held by a slow provider call stalled every
// handshake, disconnect and lookup of the node. Now it checks a snapshot
// without the mutex: while its check of one QP is stuck, another
// requester handshakes and reads, and List answers.
func TestReapDoesNotHoldManagerOverQPLocks(t *testing.T) {
	g := &activityGate{entered: make(chan struct{}), release: make(chan struct{})}
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(g.release) }) }
	t.Cleanup(release) // before the managers close (cleanups run LIFO)
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", wrapDevice: func(dev ibv.Device) ibv.Device {
		return gatedDevice{Device: dev, g: g}
	}})
	t.Cleanup(release)
	hold.fillRandom(11)
	r1 := newNode(t, d, nodeOpts{id: "req1"})
	if _, err := r1.dial.Get(ctxT(t, 10*time.Second), hold.addr); err != nil {
		t.Fatal(err)
	}
	waitDataOpen(t, hold, "req1") // live: the reap pass below finds nothing idle
	g.armed.Store(true)
	reaped := make(chan struct{})
	go func() {
		defer close(reaped)
		hold.acc.reap(time.Now().Add(time.Hour))
	}()
	select {
	case <-g.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("reaper never checked the QP")
	}

	r2 := newNode(t, d, nodeOpts{id: "req2"})
	done := make(chan error, 1)
	go func() {
		_ = hold.list()
		c, err := r2.dial.Get(ctxT(t, 10*time.Second), hold.addr)
		if err == nil {
			err = c.Read(ctxT(t, 10*time.Second), opsOf(r2, hold, []span{{0, 0, 64 << 10}}))
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("handshake and read while the reaper waits on a QP lock: %v", err)
		}
	case <-time.After(3 * time.Second):
		release()
		<-done
		t.Fatal("List/handshake blocked while the reaper waited on one QP's lock")
	}
	release()
	<-reaped
	hold.checkQPs(t, 2) // live requesters: nothing reaped
}
