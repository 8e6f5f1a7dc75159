package conn

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"
)

// Lesson 1 (docs/lessons.md L1), holder side: two requesters whose QPNs are identical (peers
// booted from one image) connect to one holder at once. The holder keys
// accepted connections by requester node id, so both live side by side:
// no accept destroys the other's QPs, and concurrent READs from both
// return the right bytes.
func TestTwoRequestersSameQPNs(t *testing.T) {
	const nics, qps = 2, 2
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: nics, qps: qps, qpnStart: 0x600, mem: 8 << 20})
	r1 := newNode(t, d, nodeOpts{id: "r1", nics: nics, qps: qps, qpnStart: 0x700, mem: 8 << 20})
	r2 := newNode(t, d, nodeOpts{id: "r2", nics: nics, qps: qps, qpnStart: 0x700, mem: 8 << 20})
	hold.fillRandom(31)

	// Both handshake at once.
	var (
		wg     sync.WaitGroup
		conns  [2]*AddrConnection
		getErr [2]error
	)
	for i, r := range []*node{r1, r2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conns[i], getErr[i] = r.dial.Get(ctxT(t, 10*time.Second), hold.addr)
		}()
	}
	wg.Wait()
	for i, err := range getErr {
		if err != nil {
			t.Fatalf("r%d: Get: %v", i+1, err)
		}
	}
	c1, c2 := conns[0], conns[1]
	q1 := r1.list()[0].NICs[0].LocalQPNs
	q2 := r2.list()[0].NICs[0].LocalQPNs
	if !slices.Equal(q1, q2) {
		t.Fatalf("requesters were meant to allocate identical QPNs: %v vs %v", q1, q2)
	}

	errs := make(chan error, 64)
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(i), 5))
			// Goroutine i owns [i×512 KiB, +256 KiB) of each requester's pool.
			lbase := uint64(i) * (512 << 10)
			s1 := []span{{lbase, r.Uint64N(7 << 20), 256 << 10}}
			s2 := []span{{lbase, r.Uint64N(7 << 20), 256 << 10}}
			for k := 0; k < 10; k++ {
				if err := c1.Read(context.Background(), opsOf(r1, hold, s1)); err != nil {
					errs <- fmt.Errorf("r1: %w", err)
					return
				}
				if err := c2.Read(context.Background(), opsOf(r2, hold, s2)); err != nil {
					errs <- fmt.Errorf("r2: %w", err)
					return
				}
			}
			for _, p := range []struct {
				r *node
				s span
			}{{r1, s1[0]}, {r2, s2[0]}} {
				if !bytes.Equal(p.r.mem[p.s.local:p.s.local+p.s.n], hold.mem[p.s.remote:p.s.remote+p.s.n]) {
					errs <- fmt.Errorf("goroutine %d: %s's bytes differ from the holder's", i, p.r.id)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	hold.checkQPs(t, 2*nics*qps) // requesters × NICs × qps_per_peer
	r1.checkQPs(t, nics*qps)
	r2.checkQPs(t, nics*qps)
	var ids []string
	for _, ci := range hold.list() {
		ids = append(ids, ci.RemoteNodeID)
	}
	slices.Sort(ids)
	if !slices.Equal(ids, []string{"r1", "r2"}) {
		t.Errorf("holder's accepted connections are from %v, want [r1 r2]", ids)
	}
	if c1.Invalid() || c2.Invalid() {
		t.Errorf("a requester connection was invalidated (r1 %v, r2 %v)", c1.Invalid(), c2.Invalid())
	}
	for _, n := range []*node{hold, r1, r2} {
		if got := sumOf(n.met.Invalidations); got != 0 {
			t.Errorf("%s: pegaflow_rdma_connection_invalidations_total = %v, want 0", n.id, got)
		}
	}
}

// Lesson 1 (docs/lessons.md L1), atomic invalidation: by the time a connection is marked
// invalid, the manager no longer hands it out. The hook runs inside
// invalidate right after the mark, on every path that invalidates (an
// explicit Invalidate, a failed Read, concurrent cycles, Close).
func TestInvalidatedNeverPublished(t *testing.T) {
	d := newDialers(t)
	hold := newNode(t, d, nodeOpts{id: "holder", nics: 2, mem: 1 << 20})
	req := newNode(t, d, nodeOpts{id: "req", nics: 2, mem: 1 << 20})

	var (
		mu         sync.Mutex
		calls      int
		violations []string
	)
	req.dial.hookInvalidated = func(c *AddrConnection) {
		got, _ := req.dial.lookup(c.peer)
		mu.Lock()
		defer mu.Unlock()
		calls++
		if got == c {
			violations = append(violations, fmt.Sprintf("connection %s (reason %v) still published after it was marked invalid", c.handshakeID, c.reason))
		}
	}

	// Explicit Invalidate.
	c, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	req.dial.Invalidate(c, errors.New("test"))

	// A Read that fails with a completion error invalidates through Read.
	c, err = req.dial.Get(ctxT(t, 5*time.Second), hold.addr)
	if err != nil {
		t.Fatal(err)
	}
	for _, cn := range c.nics {
		for i := range cn.remote {
			cn.remote[i].RKey ^= 0x5a5a
		}
	}
	if err := c.Read(ctxT(t, 5*time.Second), opsOf(req, hold, []span{{0, 0, 4096}})); !IsConnectionClass(err) {
		t.Fatalf("Read with a bad rkey = %v, want connection class", err)
	}

	// Concurrent Get/Invalidate cycles.
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 25; i++ {
				c, err := req.dial.Get(context.Background(), hold.addr)
				if err != nil {
					t.Errorf("cycle %d: Get: %v", i, err)
					return
				}
				req.dial.Invalidate(c, nil)
			}
		}()
	}
	wg.Wait()

	// Close invalidates the last one.
	if _, err := req.dial.Get(ctxT(t, 5*time.Second), hold.addr); err != nil {
		t.Fatal(err)
	}
	req.close()

	mu.Lock()
	defer mu.Unlock()
	if calls < 4 {
		t.Fatalf("hook ran %d times, want at least one per path", calls)
	}
	for _, v := range violations {
		t.Error(v)
	}
	t.Logf("%d invalidations checked", calls)
}
