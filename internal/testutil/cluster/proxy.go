package cluster

import (
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy forwards TCP connections from a loopback address of its own to a
// target, and makes the network faults that need no kernel, as etcd's
// pkg/proxy does: delay, blackhole, cut and reset. Scenarios built on it
// run without root; real packet loss and a link going down stay with
// network namespaces and tc (internal/reliability).
type Proxy struct {
	target string
	l      net.Listener

	mu        sync.Mutex // guards the fields below
	conns     map[net.Conn]struct{}
	delay     time.Duration
	blackhole bool
	refuse    bool
	closed    bool

	wg sync.WaitGroup // accept loop and copy goroutines
}

// NewProxy listens on 127.0.0.1:0 and forwards to target until the test
// ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{target: target, l: l, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.close)
	return p
}

// Addr is the proxy's address: give it to the client instead of target.
func (p *Proxy) Addr() string { return p.l.Addr().String() }

// Delay holds every chunk of bytes for d before forwarding it, both ways.
func (p *Proxy) Delay(d time.Duration) { p.set(func() { p.delay = d }) }

// Blackhole drops every byte from now on, both ways, while the connections
// stay open: a peer that stopped answering without closing anything.
func (p *Proxy) Blackhole() { p.set(func() { p.blackhole = true }) }

// Cut closes every connection and refuses new ones until Restore.
func (p *Proxy) Cut() {
	p.set(func() { p.refuse = true })
	p.closeConns(false)
}

// Reset aborts every connection with a TCP RST; new ones are accepted.
func (p *Proxy) Reset() { p.closeConns(true) }

// Restore ends every fault: no delay, no blackhole, connections accepted.
func (p *Proxy) Restore() {
	p.set(func() { p.delay, p.blackhole, p.refuse = 0, false, false })
}

func (p *Proxy) set(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
}

func (p *Proxy) state() (delay time.Duration, blackhole bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.delay, p.blackhole
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.l.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		if p.refuse || p.closed {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.mu.Unlock()
		up, err := net.DialTimeout("tcp", p.target, 5*time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, up) {
			continue
		}
		p.wg.Add(2)
		go p.pipe(up, c)
		go p.pipe(c, up)
	}
}

// track registers both ends, unless the proxy closed meanwhile.
func (p *Proxy) track(cs ...net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		for _, c := range cs {
			_ = c.Close()
		}
		return false
	}
	for _, c := range cs {
		p.conns[c] = struct{}{}
	}
	return true
}

// pipe copies src to dst chunk by chunk, applying the faults in force when
// each chunk arrives. When src ends (EOF or error) it closes both ends: no
// half-close is passed on, which gRPC does not use.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer p.forget(dst, src)
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			delay, blackhole := p.state()
			if delay > 0 {
				time.Sleep(delay)
			}
			if !blackhole {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) forget(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
		_ = c.Close()
	}
}

// closeConns closes every live connection; with rst, as an abort (RST).
func (p *Proxy) closeConns(rst bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		if tc, ok := c.(*net.TCPConn); ok && rst {
			_ = tc.SetLinger(0)
		}
		_ = c.Close()
		delete(p.conns, c)
	}
}

func (p *Proxy) close() {
	p.set(func() { p.closed = true })
	_ = p.l.Close()
	p.closeConns(false)
	p.wg.Wait()
}
