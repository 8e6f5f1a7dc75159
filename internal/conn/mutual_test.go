package conn

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
)

// checkBothWays reads a's pool from b and b's pool from a.
func checkBothWays(t *testing.T, a, b *node, ca, cb *AddrConnection) {
	t.Helper()
	s := []span{{0, 4096, 64 << 10}}
	if err := ca.Read(ctxT(t, 5*time.Second), opsOf(a, b, s)); err != nil {
		t.Fatalf("%s reads %s: %v", a.id, b.id, err)
	}
	checkSpans(t, a, b, s)
	if err := cb.Read(ctxT(t, 5*time.Second), opsOf(b, a, s)); err != nil {
		t.Fatalf("%s reads %s: %v", b.id, a.id, err)
	}
	checkSpans(t, b, a, s)
}

// getBoth runs a.Get(b) and b.Get(a) at the same instant.
func getBoth(t *testing.T, a, b *node) (ca, cb *AddrConnection) {
	t.Helper()
	var wg sync.WaitGroup
	var ea, eb error
	start := make(chan struct{})
	wg.Add(2)
	go func() { defer wg.Done(); <-start; ca, ea = a.dial.Get(ctxT(t, 10*time.Second), b.addr) }()
	go func() { defer wg.Done(); <-start; cb, eb = b.dial.Get(ctxT(t, 10*time.Second), a.addr) }()
	close(start)
	wg.Wait()
	if ea != nil || eb != nil {
		t.Fatalf("mutual Get: a→b %v, b→a %v", ea, eb)
	}
	return ca, cb
}

// Lesson 8 (docs/lessons.md L8): two nodes handshaking with each other at the same moment both
// end up connected, whatever the interleaving. The hooks force the orders
// that luck rarely produces.
func TestMutualHandshakeInterleavings(t *testing.T) {
	const nics, qps = 2, 2
	// signals shared by one scenario.
	type sig struct {
		acceptOn map[string]chan struct{} // closed when node's Accept is reached
		rpcOn    map[string]chan struct{} // closed when node's requester reaches its RPC
		once     sync.Map
	}
	closeOnce := func(s *sig, m map[string]chan struct{}, k string) {
		if _, loaded := s.once.LoadOrStore(m[k], true); !loaded {
			close(m[k])
		}
	}
	other := func(id string) string {
		if id == "A" {
			return "B"
		}
		return "A"
	}
	tests := []struct {
		name string
		set  func(s *sig, n *node)
	}{
		{"A's RPC waits for B's request to reach A", func(s *sig, n *node) {
			if n.id == "A" {
				n.dial.hookBeforeRPC = func(string) { <-s.acceptOn["A"] }
			}
		}},
		{"B's RPC waits for A's request to reach B", func(s *sig, n *node) {
			if n.id == "B" {
				n.dial.hookBeforeRPC = func(string) { <-s.acceptOn["B"] }
			}
		}},
		{"both RPCs leave together", func(s *sig, n *node) {
			n.dial.hookBeforeRPC = func(string) {
				closeOnce(s, s.rpcOn, n.id)
				<-s.rpcOn[other(n.id)]
			}
		}},
		{"each Accept waits until its own RPC is in flight", func(s *sig, n *node) {
			n.dial.hookBeforeRPC = func(string) { closeOnce(s, s.rpcOn, n.id) }
			n.acc.hookAccept = func(*pegadv1.RdmaHandshakeRequest) { <-s.rpcOn[n.id] }
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDialers(t)
			a := newNode(t, d, nodeOpts{id: "A", nics: nics, qps: qps, qpnStart: 0x300, mem: 1 << 20})
			b := newNode(t, d, nodeOpts{id: "B", nics: nics, qps: qps, qpnStart: 0x300, mem: 1 << 20})
			a.fillRandom(1)
			b.fillRandom(2)
			s := &sig{acceptOn: map[string]chan struct{}{}, rpcOn: map[string]chan struct{}{}}
			for _, id := range []string{"A", "B"} {
				s.acceptOn[id], s.rpcOn[id] = make(chan struct{}), make(chan struct{})
			}
			for _, n := range []*node{a, b} {
				n.acc.hookAccept = func(*pegadv1.RdmaHandshakeRequest) { closeOnce(s, s.acceptOn, n.id) }
				tc.set(s, n)
			}
			var wg sync.WaitGroup
			conns := map[string]*AddrConnection{}
			var mu sync.Mutex
			for _, p := range [][2]*node{{a, b}, {b, a}} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c, err := p[0].dial.Get(ctxT(t, 10*time.Second), p[1].addr)
					if err != nil {
						t.Errorf("%s.Get(%s): %v", p[0].id, p[1].id, err)
						return
					}
					mu.Lock()
					conns[p[0].id] = c
					mu.Unlock()
				}()
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			checkBothWays(t, a, b, conns["A"], conns["B"])
			// Each node: its requester QPs plus the ones it accepted.
			a.checkQPs(t, 2*nics*qps)
			b.checkQPs(t, 2*nics*qps)
		})
	}
}

// 200 rounds of both nodes connecting to each other at once, reading both
// ways and dropping both connections: no crash, no wedge, no leak.
func TestMutualHandshakeRace(t *testing.T) {
	const nics, qps, rounds = 2, 1, 200
	d := newDialers(t)
	a := newNode(t, d, nodeOpts{id: "A", nics: nics, qps: qps, mem: 1 << 20})
	b := newNode(t, d, nodeOpts{id: "B", nics: nics, qps: qps, mem: 1 << 20})
	a.fillRandom(1)
	b.fillRandom(2)
	for i := 0; i < rounds; i++ {
		ca, cb := getBoth(t, a, b)
		checkBothWays(t, a, b, ca, cb)
		a.dial.Invalidate(ca, nil)
		b.dial.Invalidate(cb, nil)
	}
	waitFor(t, "requester sides torn down", func() bool { return a.workers() == 0 && b.workers() == 0 })
	// Each side's disconnect freed the other's accepted connection too.
	waitFor(t, "accepted sides released", func() bool { return a.nics.QPs() == 0 && b.nics.QPs() == 0 })
	a.checkQPs(t, 0)
	b.checkQPs(t, 0)
}

// Close aborts in-flight Reads (they return once drained), destroys every
// QP of both roles and refuses further work.
func TestCloseAbortsInFlight(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2, qps: 2})
	req := newNode(t, d, nodeOpts{id: "req", nics: 2, qps: 2})
	c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := hold.dial.Get(ctxT(t, 5*time.Second), req.addr); err != nil {
		t.Fatal(err)
	}
	for _, dev := range hold.devs {
		dev.SetFaults(tcp.Faults{ResponseDelay: 400 * time.Millisecond})
	}
	done := make(chan error, 1)
	go func() { done <- c.Read(context.Background(), opsOf(req, hold, []span{{0, 0, 256 << 10}})) }()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if err := req.close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 300*time.Millisecond {
		t.Errorf("Close took %v: it should abort in-flight Reads", took)
	}
	if err := <-done; !IsConnectionClass(err) {
		t.Errorf("in-flight Read = %v, want connection class", err)
	}
	req.checkQPs(t, 0)
	if w := req.workers(); w != 0 {
		t.Errorf("workers = %d after Close", w)
	}
	if _, err := req.dial.Get(context.Background(), hold.addr); !errors.Is(err, ErrClosed) {
		t.Errorf("Get after Close = %v", err)
	}
	if _, err := req.acc.Accept(context.Background(), &pegadv1.RdmaHandshakeRequest{}); err == nil {
		t.Error("Accept after Close succeeded")
	}
	if len(req.list()) != 0 {
		t.Error("connections listed after Close")
	}
}

// FuzzHandshakeDecode feeds arbitrary bytes, decoded as handshake request
// and response, to the validators: never a panic, and anything accepted
// is within the limits.
func FuzzHandshakeDecode(f *testing.F) {
	good := &pegadv1.RdmaHandshakeRequest{
		Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "i"}, Transport: "tcp", HandshakeId: "h",
		Nics: []*pegadv1.NicHandshake{{Nic: "n", Endpoints: []*pegadv1.Endpoint{{Qpn: 0x100, Psn: 1, Addr: "127.0.0.1:9"}},
			Memory: []*pegadv1.MemoryRegion{{Base: 4096, Length: 4096, Rkey: 7}}}},
	}
	seed, _ := proto.Marshal(good)
	f.Add(seed)
	resp, _ := proto.Marshal(&pegadv1.RdmaHandshakeResponse{HolderNodeId: "h", Nics: good.Nics})
	f.Add(resp)
	f.Add([]byte{})
	f.Add([]byte{0x1a, 0x02, 0x12, 0x00})
	nics := &NICs{opts: NICOptions{Transport: "tcp"}}
	nics.nicSet.Store(&[]*localNIC{{}})
	acc := &Acceptor{nics: nics}
	d := &Dialer{nics: nics, opts: DialerOptions{QPsPerPeer: 1}}
	f.Fuzz(func(t *testing.T, data []byte) {
		var req pegadv1.RdmaHandshakeRequest
		if proto.Unmarshal(data, &req) == nil {
			if nics, err := acc.validateRequest(&req); err == nil {
				for _, n := range nics {
					if len(n.endpoints) == 0 || len(n.endpoints) > maxQPsPerPeer {
						t.Fatalf("accepted %d endpoints", len(n.endpoints))
					}
				}
			} else if !errors.Is(err, ErrInvalidHandshake) {
				t.Fatalf("untyped error %v", err)
			}
		}
		var r pegadv1.RdmaHandshakeResponse
		if proto.Unmarshal(data, &r) == nil {
			if nics, err := d.validateResponse(&r, len(nics.curNICs())); err == nil {
				for _, n := range nics {
					if len(n.regions) == 0 {
						t.Fatal("accepted an empty memory snapshot")
					}
					for _, reg := range n.regions {
						if reg.Length == 0 || reg.Base+reg.Length < reg.Base {
							t.Fatalf("accepted bad region %+v", reg)
						}
					}
				}
			} else if !errors.Is(err, ErrInvalidHandshake) {
				t.Fatalf("untyped error %v", err)
			}
		}
	})
}

// Close waits for an Accept in flight, which then aborts (Unavailable)
// and leaves no QP; the PDs are released only after it.
func TestCloseDuringAccept(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2})
	req := newNode(t, d, nodeOpts{id: "req", nics: 2, qps: 2})
	entered, release := make(chan struct{}), make(chan struct{})
	hold.acc.hookAccept = func(*pegadv1.RdmaHandshakeRequest) { close(entered); <-release }
	getErr := make(chan error, 1)
	go func() {
		_, err := req.dial.Get(ctxT(t, 10*time.Second), hold.addr)
		getErr <- err
	}()
	<-entered
	closed := make(chan struct{})
	go func() { hold.close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while an Accept was running")
	case <-time.After(50 * time.Millisecond):
	}
	close(release)
	<-closed
	if err := <-getErr; !errors.Is(err, ErrConnectionBroken) {
		t.Errorf("Get = %v, want ErrConnectionBroken (holder Unavailable)", err)
	}
	hold.checkQPs(t, 0)
	req.checkQPs(t, 0)
}
