package conn

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
)

// disconnectBound is how long a holder may keep an abandoned connection's
// QPs after its requester invalidated it: one loopback RPC, with slack
// for the race detector on a loaded 2-core machine.
const disconnectBound = 3 * time.Second

// holderConns is the holder-role connected gauge.
func holderConns(n *node) float64 {
	return testutil.ToFloat64(n.met.Conns.WithLabelValues(RoleHolder, StateConnected))
}

// readCheck reads a span of hold's pool through c and checks the bytes.
func readCheck(t *testing.T, c *AddrConnection, req, hold *node, s span) {
	t.Helper()
	if err := c.Read(ctxT(t, 10*time.Second), opsOf(req, hold, []span{s})); err != nil {
		t.Fatalf("read through %s: %v", c.handshakeID, err)
	}
	checkSpans(t, req, hold, []span{s})
}

// The holder drops an accepted connection as soon as its requester
// invalidates it, whatever the reason, instead of holding its QPs until
// the requester handshakes again.
func TestInvalidateReleasesHolderQPs(t *testing.T) {
	const nics, qps = 2, 2
	for _, tc := range []struct {
		name   string
		reason error
	}{
		{"manual", nil},
		{"deadline", context.DeadlineExceeded},
		{"completion_error", &ibv.StatusError{Status: ibv.WCRetryExcErr}},
		{"peer_restarted", ErrPeerRestarted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDialers(t)
			hold := newNode(t, d, nodeOpts{id: "holder", nics: nics, qps: qps, qpnStart: 0x100})
			r := newNode(t, d, nodeOpts{id: "req", nics: nics, qps: qps, qpnStart: 0x100})
			hold.fillRandom(7)
			c, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
			if err != nil {
				t.Fatal(err)
			}
			readCheck(t, c, r, hold, span{0, 4096, 64 << 10})
			hold.checkQPs(t, nics*qps)

			start := time.Now()
			r.dial.Invalidate(c, tc.reason)
			if !eventually(disconnectBound, func() bool { return hold.nics.QPs() == 0 }) {
				t.Fatalf("holder still has %d QPs %v after the requester invalidated", hold.nics.QPs(), disconnectBound)
			}
			t.Logf("holder released its QPs %v after invalidation", time.Since(start).Round(time.Millisecond))
			hold.checkQPs(t, 0)
			r.checkQPs(t, 0)
			if got := holderConns(hold); got != 0 {
				t.Errorf("holder connected gauge = %v, want 0", got)
			}
			if got := testutil.ToFloat64(hold.met.Invalidations.WithLabelValues("disconnect")); got != 1 {
				t.Errorf("holder invalidations{disconnect} = %v, want 1", got)
			}
			if got := len(hold.list()); got != 0 {
				t.Errorf("holder lists %d connections, want 0", got)
			}
			// The requester reconnects as usual and reads again.
			c2, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
			if err != nil {
				t.Fatal(err)
			}
			readCheck(t, c2, r, hold, span{1 << 20, 8192, 128 << 10})
			hold.checkQPs(t, nics*qps)
		})
	}
}

// A disconnect that arrives after the same requester handshook again (the
// old connection's teardown waited for an in-flight Read meanwhile) must
// leave the new connection alone.
func TestStaleDisconnectKeepsNewConnection(t *testing.T) {
	const qps = 2
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", qps: qps})
	r := newNode(t, d, nodeOpts{id: "req", qps: qps})
	hold.fillRandom(11)
	c1, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	release := holdRef(t, r, c1) // an in-flight Read: c1's teardown waits
	r.dial.Invalidate(c1, errors.New("test"))
	c2, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	if c2.handshakeID == c1.handshakeID {
		t.Fatal("re-handshake reused the handshake id")
	}
	if got := hold.disconnects.Load(); got != 0 {
		t.Fatalf("%d disconnects before c1's teardown", got)
	}
	release() // c1 torn down: its disconnect (c1's id) goes out now
	waitFor(t, "c1's disconnect served", func() bool { return hold.disconnects.Load() == 1 })
	// And once more, by hand, after the fact.
	cl, err := d.dial(hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := cl.RdmaDisconnect(ctxT(t, 5*time.Second), &pegadv1.RdmaDisconnectRequest{
		Requester: &pegadv1.Requester{NodeId: "req", Incarnation: "inc-1"}, HandshakeId: c1.handshakeID,
	})
	if err != nil || resp.GetQpsReleased() != 0 {
		t.Fatalf("stale disconnect: released %d, err %v; want 0, nil", resp.GetQpsReleased(), err)
	}
	hold.checkQPs(t, qps)
	if got := holderConns(hold); got != 1 {
		t.Errorf("holder connected gauge = %v, want 1", got)
	}
	if l := hold.list(); len(l) != 1 || l[0].QPs != qps {
		t.Fatalf("holder connections = %+v, want c2's", l)
	}
	readCheck(t, c2, r, hold, span{0, 12345, 256 << 10})
	if c2.Invalid() {
		t.Fatal("c2 invalidated")
	}
}

// Only the requester node that made a handshake can disconnect it;
// malformed requests are InvalidArgument and change nothing.
func TestDisconnectOwnershipAndValidation(t *testing.T) {
	const qps = 2
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", qps: qps})
	r := newNode(t, d, nodeOpts{id: "req", qps: qps})
	hold.fillRandom(13)
	c, err := r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := d.dial(hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	id := c.handshakeID
	for _, tc := range []struct {
		name string
		req  *pegadv1.RdmaDisconnectRequest
		code codes.Code
	}{
		{"other node", &pegadv1.RdmaDisconnectRequest{Requester: &pegadv1.Requester{NodeId: "intruder", Incarnation: "inc-1"}, HandshakeId: id}, codes.OK},
		{"other incarnation", &pegadv1.RdmaDisconnectRequest{Requester: &pegadv1.Requester{NodeId: "req", Incarnation: "inc-0"}, HandshakeId: id}, codes.OK},
		{"unknown handshake", &pegadv1.RdmaDisconnectRequest{Requester: &pegadv1.Requester{NodeId: "req", Incarnation: "inc-1"}, HandshakeId: "feedfacefeedface"}, codes.OK},
		{"no requester", &pegadv1.RdmaDisconnectRequest{HandshakeId: id}, codes.InvalidArgument},
		{"no handshake id", &pegadv1.RdmaDisconnectRequest{Requester: &pegadv1.Requester{NodeId: "req", Incarnation: "inc-1"}}, codes.InvalidArgument},
		{"long handshake id", &pegadv1.RdmaDisconnectRequest{Requester: &pegadv1.Requester{NodeId: "req", Incarnation: "inc-1"}, HandshakeId: strings.Repeat("a", maxHandshakeID+1)}, codes.InvalidArgument},
		{"long node id", &pegadv1.RdmaDisconnectRequest{Requester: &pegadv1.Requester{NodeId: strings.Repeat("r", maxNodeIDLen+1)}, HandshakeId: id}, codes.InvalidArgument},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := cl.RdmaDisconnect(ctxT(t, 5*time.Second), tc.req)
			if got := status.Code(err); got != tc.code {
				t.Fatalf("code = %v (%v), want %v", got, err, tc.code)
			}
			if resp.GetQpsReleased() != 0 {
				t.Fatalf("released %d QPs", resp.GetQpsReleased())
			}
			hold.checkQPs(t, qps)
			readCheck(t, c, r, hold, span{0, 4096, 32 << 10})
		})
	}
	// The owner's disconnect does release it, and a repeat is a no-op.
	for i, want := range []uint32{qps, 0} {
		resp, err := cl.RdmaDisconnect(ctxT(t, 5*time.Second), &pegadv1.RdmaDisconnectRequest{
			Requester: &pegadv1.Requester{NodeId: "req", Incarnation: "inc-1"}, HandshakeId: id,
		})
		if err != nil || resp.GetQpsReleased() != want {
			t.Fatalf("owner disconnect %d: released %d, err %v; want %d", i, resp.GetQpsReleased(), err, want)
		}
	}
	hold.checkQPs(t, 0)
}

// Close sends a disconnect for each of its connections and returns only
// after they were answered: the holders' QPs are gone when it returns.
func TestCloseSendsDisconnects(t *testing.T) {
	d := newDialers(t)
	h1 := newNode(t, d, nodeOpts{id: "h1", qps: 2})
	h2 := newNode(t, d, nodeOpts{id: "h2", nics: 2, qps: 1})
	r := newNode(t, d, nodeOpts{id: "req", nics: 2, qps: 2})
	for _, h := range []*node{h1, h2} {
		if _, err := r.dial.Get(ctxT(t, 10*time.Second), h.addr); err != nil {
			t.Fatal(err)
		}
	}
	h1.checkQPs(t, 2*2)
	h2.checkQPs(t, 2*2)
	if err := r.close(); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*node{h1, h2} {
		if got := h.disconnects.Load(); got != 1 {
			t.Errorf("%s served %d disconnects, want 1", h.id, got)
		}
		h.checkQPs(t, 0)
	}
	r.checkQPs(t, 0)
}

// A holder that is dead (server gone) or hung (never answers) delays
// neither Invalidate nor Close beyond the disconnect timeout.
func TestDeadHolderDoesNotBlock(t *testing.T) {
	const timeout = 1500 * time.Millisecond
	for _, tc := range []struct {
		name string
		kill func(h *node)
	}{
		{"stopped", func(h *node) { h.srv.Stop() }},
		{"hung", func(h *node) { h.stallDisconnect.Store(true) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDialers(t)
			h1 := newNode(t, d, nodeOpts{id: "h1"})
			h2 := newNode(t, d, nodeOpts{id: "h2"})
			r := newNode(t, d, nodeOpts{id: "req", disconnectTimeout: timeout})
			c1, err := r.dial.Get(ctxT(t, 10*time.Second), h1.addr)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.dial.Get(ctxT(t, 10*time.Second), h2.addr); err != nil {
				t.Fatal(err)
			}
			tc.kill(h1)
			tc.kill(h2)

			start := time.Now()
			r.dial.Invalidate(c1, errors.New("holder dead"))
			if took := time.Since(start); took > timeout/2 {
				t.Errorf("Invalidate took %v: it waited for the disconnect (timeout %v)", took, timeout)
			}
			start = time.Now()
			if err := r.close(); err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > timeout+time.Second {
				t.Errorf("Close took %v, want at most about the disconnect timeout %v", took, timeout)
			}
			r.checkQPs(t, 0)
		})
	}
}

// FuzzDisconnectDecode feeds arbitrary bytes, decoded as an RdmaDisconnect
// request, to the holder side: never a panic, a failure is always a typed
// InvalidArgument, and the installed connection goes exactly when node,
// incarnation and handshake id all match it.
func FuzzDisconnectDecode(f *testing.F) {
	for _, r := range []*pegadv1.RdmaDisconnectRequest{
		{Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "i"}, HandshakeId: "h"},
		{Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "i"}, HandshakeId: "other"},
		{Requester: &pegadv1.Requester{NodeId: "x", Incarnation: "i"}, HandshakeId: "h"},
		{HandshakeId: "h"},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{})
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})
	acc := &Acceptor{nics: &NICs{opts: NICOptions{Transport: "tcp"}}, met: metricstest.New(), log: zerolog.Nop(),
		accepted: make(map[string]*acceptedConn)}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req pegadv1.RdmaDisconnectRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		a := &acceptedConn{acc: acc, nodeID: "r", incarnation: "i", handshakeID: "h"}
		acc.accepted = map[string]*acceptedConn{"r": a}
		resp, err := acc.Disconnect(context.Background(), &req)
		if err != nil {
			if !errors.Is(err, ErrInvalidHandshake) || status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v (code %v), want a typed InvalidArgument", err, status.Code(err))
			}
		} else if resp.GetQpsReleased() != 0 {
			t.Fatalf("released %d QPs of a connection that has none", resp.GetQpsReleased())
		}
		match := req.GetRequester().GetNodeId() == "r" && req.GetRequester().GetIncarnation() == "i" && req.GetHandshakeId() == "h"
		if _, still := acc.accepted["r"]; still == match {
			t.Fatalf("request %v: connection still installed = %v", &req, still)
		}
	})
}
