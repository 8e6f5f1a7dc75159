package requester_test

import (
	"context"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
)

// cutProxy forwards 127.0.0.1:<port> to a target; down closes the port
// and every connection through it (a cut link), up opens the same port
// again (the link back).
type cutProxy struct {
	t      *testing.T
	addr   string
	target string

	mu    sync.Mutex // guards ln, conns
	ln    net.Listener
	conns []net.Conn
	wg    sync.WaitGroup // accept loops and copies
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	p := &cutProxy{t: t, target: target}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	t.Cleanup(func() { p.down(); p.wg.Wait() })
	return p
}

func (p *cutProxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", p.target)
			if err != nil {
				_ = c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, u)
			p.mu.Unlock()
			for _, pair := range [][2]net.Conn{{c, u}, {u, c}} {
				p.wg.Add(1)
				go func() {
					defer p.wg.Done()
					_, _ = io.Copy(pair[0], pair[1])
					_ = pair[0].Close()
					_ = pair[1].Close()
				}()
			}
		}
	}()
}

func (p *cutProxy) down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		_ = p.ln.Close()
		p.ln = nil
	}
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *cutProxy) up() {
	p.t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		p.t.Skipf("address %s taken meanwhile: %v", p.addr, err)
	}
	p.serve(ln)
}

// TestE2EStaleChannelReadiedBeforeLock: right after the link to a holder
// came back, the peer's gRPC channel is still in reconnect backoff and
// would fail the lock query at once with the cut-time dial error. The
// prefetch makes the channel reconnect before its (single) query and
// succeeds. Real gRPC channel; the link is a proxy cut and reopened.
func TestE2EStaleChannelReadiedBeforeLock(t *testing.T) {
	h := newE2ENode(t, "holder", 16*mib, true, 0)
	req := newE2ENode(t, "requester", 16*mib, false, 0)
	r := rand.New(rand.NewPCG(3, 9))
	for _, k := range []string{"a", "b"} {
		putRandom(t, h, r, "ns", k, []store.SlotSize{{KSize: 64 << 10}})
	}
	px := newCutProxy(t, h.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := req.engine.Prefetch(ctx, px.addr, "ns", [][]byte{[]byte("a")}); err != nil {
		t.Fatal(err)
	}
	px.down()
	// A fetch over the cut link fails and leaves the channel in backoff.
	if _, err := req.engine.Prefetch(ctx, px.addr, "ns", [][]byte{[]byte("b")}); err == nil {
		t.Fatal("prefetch over a cut link succeeded")
	}
	px.up()
	res, err := req.engine.Prefetch(ctx, px.addr, "ns", [][]byte{[]byte("b")})
	if err != nil {
		t.Fatalf("prefetch right after the link came back: %v", err)
	}
	if b := res.Blocks[0]; b.Status != requester.StatusFetched {
		t.Fatalf("block b: %v %v", b.Status, b.Err)
	}
}
