package kvevents

import (
	"container/list"
	"net"
	"net/netip"
	"sync"

	"github.com/pegaflow/pegad/internal/metrics"
)

// Limits on connections still in their ZMTP handshake. Anyone who can
// reach the port can open one, and until its READY it is nobody's
// subscriber: each holds a goroutine, a file and two 4 KiB buffers for at
// most handshakeTimeout. A real subscriber greets at once, so when a
// limit is reached the oldest waiting connection (of the same source,
// else of all) is cut, not the new one: a flood cannot lock a router out,
// only make it reconnect (ZeroMQ reconnects by itself).
const (
	maxHalfOpen          = 512
	maxHalfOpenPerSource = 64
)

// halfOpen tracks one server's connections in their handshake.
type halfOpen struct {
	maxTotal, maxPerSource int

	mu    sync.Mutex // guards order, bySrc and every entry's nc
	order *list.List // of *halfOpenEntry, oldest first
	bySrc map[netip.Addr]int
}

type halfOpenEntry struct {
	nc  net.Conn // nil once it has left or been evicted
	src netip.Addr
}

func newHalfOpen(maxTotal, maxPerSource int) *halfOpen {
	return &halfOpen{maxTotal: maxTotal, maxPerSource: maxPerSource, order: list.New(), bySrc: map[netip.Addr]int{}}
}

// enter admits nc as in its handshake. When a limit is reached it evicts
// the oldest waiting connection (of nc's source first) and returns it with
// the metric reason; the caller closes it outside the lock.
func (h *halfOpen) enter(nc net.Conn) (e *list.Element, evicted net.Conn, reason string) {
	src := sourceOf(nc.RemoteAddr())
	h.mu.Lock()
	defer h.mu.Unlock()
	var victim *list.Element
	switch {
	case h.bySrc[src] >= h.maxPerSource:
		for v := h.order.Front(); v != nil; v = v.Next() {
			if v.Value.(*halfOpenEntry).src == src {
				victim, reason = v, metrics.KVRefusedSourceLimit
				break
			}
		}
	case h.order.Len() >= h.maxTotal:
		victim, reason = h.order.Front(), metrics.KVRefusedTotalLimit
	}
	if victim != nil {
		evicted = victim.Value.(*halfOpenEntry).nc
		h.removeLocked(victim)
	}
	h.bySrc[src]++
	return h.order.PushBack(&halfOpenEntry{nc: nc, src: src}), evicted, reason
}

// leave removes e once its handshake ended; false: it was evicted (its
// connection is closed, and already counted).
func (h *halfOpen) leave(e *list.Element) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e.Value.(*halfOpenEntry).nc == nil {
		return false
	}
	h.removeLocked(e)
	return true
}

func (h *halfOpen) removeLocked(e *list.Element) {
	he := e.Value.(*halfOpenEntry)
	h.order.Remove(e)
	if h.bySrc[he.src]--; h.bySrc[he.src] <= 0 {
		delete(h.bySrc, he.src)
	}
	he.nc = nil
}

// waiting is the number of connections in their handshake.
func (h *halfOpen) waiting() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.order.Len()
}

// sourceOf is a TCP peer's address; every ipc:// peer shares the zero one.
func sourceOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	return netip.Addr{}
}
