// Package netgate bounds half-open connections: those a listener has
// accepted that have not yet completed their protocol's first step (a
// hello, the HTTP/2 client preface and first frame, an HTTP request's
// headers, a TLS handshake). Anyone who can reach a port can open them, and
// each holds a goroutine and a file until its server's own deadline. A Gate
// keeps them in arrival order, counted per source (a TCP peer's IP address,
// a unix peer's uid), and when a per-source or total limit is reached the
// oldest waiting connection (of that source first, else of all) is evicted,
// not the new one: a real client speaks right after connecting, so a flood
// can only make it redial, never lock it out. Listener applies a Gate and a
// deadline to a server whose accept loop is not ours (gRPC, net/http).
//
// It owns the half-open bookkeeping only. It must never read, buffer or
// change the bytes a connection carries (it only watches the ones its
// server reads), never touch a connection once it has passed its first
// step, and never import the metrics or logging of its callers: refusals
// are reported through Options.Refused.
package netgate

import (
	"container/list"
	"fmt"
	"net"
	"net/netip"
	"sync"

	"golang.org/x/sys/unix"
)

// Default limits on half-open connections of one listener.
const (
	DefaultMaxHalfOpen          = 512
	DefaultMaxHalfOpenPerSource = 64
)

// Reasons a half-open connection is dropped (metric labels; see
// metrics.HalfOpenReasons).
const (
	ReasonSourceLimit = "source_limit" // evicted: too many half-open connections from its source
	ReasonTotalLimit  = "total_limit"  // evicted: too many half-open connections in all
	ReasonTimeout     = "timeout"      // its first step took longer than the deadline
)

// Source is where a connection comes from, as far as the limits go: the IP
// address of a TCP peer, the uid of a unix one (SO_PEERCRED); the zero
// Source for anything else (all such connections share one budget).
type Source struct {
	ip     netip.Addr
	uid    uint32
	hasUID bool
}

// SourceOf is c's source.
func SourceOf(c net.Conn) Source {
	switch a := c.RemoteAddr().(type) {
	case *net.TCPAddr:
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			return Source{ip: ip.Unmap()}
		}
	case *net.UnixAddr:
		if uc, ok := c.(*net.UnixConn); ok {
			if cred := PeerCred(uc); cred != nil {
				return UIDSource(cred.Uid)
			}
		}
	}
	return Source{}
}

// UIDSource is the source of a unix peer of uid, for a caller that has its
// credentials already (SourceOf looks them up).
func UIDSource(uid uint32) Source { return Source{uid: uid, hasUID: true} }

func (s Source) String() string {
	switch {
	case s.hasUID:
		return fmt.Sprintf("uid=%d", s.uid)
	case s.ip.IsValid():
		return s.ip.String()
	}
	return "unknown"
}

// PeerCred is the credentials of the process on the other end of c
// (SO_PEERCRED); nil when unknown.
func PeerCred(c *net.UnixConn) *unix.Ucred {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	var cred *unix.Ucred
	_ = raw.Control(func(fd uintptr) { cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) })
	return cred
}

// Gate tracks the half-open connections of one listener; T is what the
// caller keeps of each (the connection, or its own wrapper of it). Safe
// for concurrent use.
type Gate[T any] struct {
	maxTotal, maxPerSource int // immutable

	mu    sync.Mutex // guards order, bySrc and every entry's gone
	order *list.List // of *Entry[T], oldest first
	bySrc map[Source]int
}

// Entry is one connection's place in a Gate, from Enter to Leave.
type Entry[T any] struct {
	v    T
	src  Source
	el   *list.Element
	gone bool // left or evicted
}

// Value is what Enter was given.
func (e *Entry[T]) Value() T { return e.v }

// New returns a gate that holds at most maxTotal half-open connections, and
// at most maxPerSource of one source; 0 (or less) takes the defaults.
func New[T any](maxTotal, maxPerSource int) *Gate[T] {
	if maxTotal <= 0 {
		maxTotal = DefaultMaxHalfOpen
	}
	if maxPerSource <= 0 {
		maxPerSource = DefaultMaxHalfOpenPerSource
	}
	return &Gate[T]{maxTotal: maxTotal, maxPerSource: maxPerSource, order: list.New(), bySrc: make(map[Source]int)}
}

// Enter admits v, from src, as half-open. When a limit is reached it
// evicts the oldest half-open connection (of src first, else of all) and
// returns its entry with the reason; the caller closes it (outside the
// gate's lock) and counts it. evicted is nil when nothing was.
func (g *Gate[T]) Enter(v T, src Source) (e, evicted *Entry[T], reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	var victim *list.Element
	switch {
	case g.bySrc[src] >= g.maxPerSource:
		for el := g.order.Front(); el != nil; el = el.Next() {
			if el.Value.(*Entry[T]).src == src {
				victim, reason = el, ReasonSourceLimit
				break
			}
		}
	case g.order.Len() >= g.maxTotal:
		victim, reason = g.order.Front(), ReasonTotalLimit
	}
	if victim != nil {
		evicted = victim.Value.(*Entry[T])
		g.removeLocked(evicted)
	}
	g.bySrc[src]++
	e = &Entry[T]{v: v, src: src}
	e.el = g.order.PushBack(e)
	return e, evicted, reason
}

// Leave removes e (its first step is done, or failed). It reports false
// when e had left already or was evicted: its connection is being closed,
// and was counted by whoever evicted it.
func (g *Gate[T]) Leave(e *Entry[T]) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if e.gone {
		return false
	}
	g.removeLocked(e)
	return true
}

func (g *Gate[T]) removeLocked(e *Entry[T]) {
	g.order.Remove(e.el)
	if g.bySrc[e.src]--; g.bySrc[e.src] <= 0 {
		delete(g.bySrc, e.src)
	}
	e.gone = true
}

// Waiting is the number of half-open connections.
func (g *Gate[T]) Waiting() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.order.Len()
}
