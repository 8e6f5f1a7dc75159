package tcp

import (
	"container/list"
	"net"
	"net/netip"
	"sync"
)

// Limits on data connections that have not said hello yet. Anyone who can
// reach the data port can open one, so what it may hold is bounded: a
// goroutine and a hello-sized buffer each (no frame buffer before a valid
// hello), at most defaultMaxPreHello of them per device and
// defaultMaxPreHelloPerSource per source address. A real requester sends
// its hello right after connecting, so when a limit is reached the oldest
// waiting connection (of that source, else of all) is dropped, not the new
// one: a flood cannot lock a real peer out, it can only make it redial
// (which it does within its retry budget).
const (
	defaultMaxPreHello          = 512
	defaultMaxPreHelloPerSource = 64
)

// Reasons of the refused-connections metric.
const (
	refusedSourceLimit = "source_limit"  // evicted: too many pre-hello connections from its source
	refusedTotalLimit  = "total_limit"   // evicted: too many pre-hello connections in all
	refusedBadHello    = "bad_hello"     // first frame not a well-formed hello
	refusedHelloWait   = "hello_timeout" // no hello within helloTimeout
	refusedRejected    = "rejected"      // well-formed hello refused (no such QP, state, mismatch)
	refusedBadSecret   = "bad_secret"    // hello without the target QP's handshake secret
)

// helloGate tracks the pre-hello connections of one device.
type helloGate struct {
	maxTotal, maxPerSource int

	mu    sync.Mutex // guards order, bySrc
	order *list.List // of *gateEntry, oldest first
	bySrc map[netip.Addr]int
}

type gateEntry struct {
	c   *dconn
	src netip.Addr
}

func newHelloGate(maxTotal, maxPerSource int) *helloGate {
	if maxTotal <= 0 {
		maxTotal = defaultMaxPreHello
	}
	if maxPerSource <= 0 {
		maxPerSource = defaultMaxPreHelloPerSource
	}
	return &helloGate{maxTotal: maxTotal, maxPerSource: maxPerSource, order: list.New(), bySrc: make(map[netip.Addr]int)}
}

// enter admits c as waiting for its hello. When a limit is reached it
// evicts the oldest waiting connection (of c's source first) and returns
// it with the reason; the caller closes it (outside the gate's lock).
func (g *helloGate) enter(c *dconn) (e *list.Element, evicted *dconn, reason string) {
	src := sourceOf(c.c.RemoteAddr())
	g.mu.Lock()
	defer g.mu.Unlock()
	var victim *list.Element
	switch {
	case g.bySrc[src] >= g.maxPerSource:
		for v := g.order.Front(); v != nil; v = v.Next() {
			if v.Value.(*gateEntry).src == src {
				victim, reason = v, refusedSourceLimit
				break
			}
		}
	case g.order.Len() >= g.maxTotal:
		victim, reason = g.order.Front(), refusedTotalLimit
	}
	if victim != nil {
		evicted = victim.Value.(*gateEntry).c
		g.removeLocked(victim)
	}
	g.bySrc[src]++
	return g.order.PushBack(&gateEntry{c: c, src: src}), evicted, reason
}

// leave removes e (after the hello, good or bad). It reports false when e
// was evicted meanwhile: its connection is closed and already counted.
func (g *helloGate) leave(e *list.Element) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.Value.(*gateEntry).c == nil {
		return false
	}
	g.removeLocked(e)
	return true
}

func (g *helloGate) removeLocked(e *list.Element) {
	ge := e.Value.(*gateEntry)
	g.order.Remove(e)
	if g.bySrc[ge.src]--; g.bySrc[ge.src] <= 0 {
		delete(g.bySrc, ge.src)
	}
	ge.c = nil // marks it gone for leave
}

// waiting is the number of connections waiting for their hello.
func (g *helloGate) waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.order.Len()
}

func sourceOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}
