package netgate

import (
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultTimeout is how long a connection accepted by a Listener may stay
// half-open before it is closed.
const DefaultTimeout = 10 * time.Second

// A Step recognises a protocol's first step in the bytes a connection
// delivers to its server. It returns a scanner for one connection, fed
// every chunk its server reads, in order, until it reports true.
type Step func() func(p []byte) (done bool)

// Options configure a Listener.
type Options struct {
	// Step ends a connection's half-open time; nil: only Pass does (a TLS
	// handshake, which the listener cannot see into).
	Step Step
	// Timeout closes a connection still half-open after it; 0:
	// DefaultTimeout.
	Timeout time.Duration
	// MaxHalfOpen and MaxHalfOpenPerSource: see New.
	MaxHalfOpen, MaxHalfOpenPerSource int
	// Refused, when set, is told of every connection evicted or timed out
	// (ReasonSourceLimit, ReasonTotalLimit, ReasonTimeout).
	Refused func(reason string)
}

// Listener is a net.Listener whose accepted connections are bounded by a
// Gate until they pass their first step. Its connections are *Conn.
type Listener struct {
	net.Listener
	gate    *Gate[*Conn]
	step    Step          // immutable
	timeout time.Duration // immutable
	refused func(string)  // immutable; nil: none

	// acceptMu serialises Accept's enter and timer set-up, so that an
	// eviction by a later Accept always finds its victim's timer.
	acceptMu sync.Mutex
}

// NewListener bounds the half-open connections of l.
func NewListener(l net.Listener, o Options) *Listener {
	if o.Timeout <= 0 {
		o.Timeout = DefaultTimeout
	}
	return &Listener{Listener: l, gate: New[*Conn](o.MaxHalfOpen, o.MaxHalfOpenPerSource), step: o.Step,
		timeout: o.Timeout, refused: o.Refused}
}

// Waiting is the number of half-open connections.
func (l *Listener) Waiting() int { return l.gate.Waiting() }

// Accept waits for the next connection and admits it as half-open,
// evicting the oldest one of its source (or of all) when a limit is
// reached.
func (l *Listener) Accept() (net.Conn, error) {
	nc, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c := &Conn{Conn: nc, l: l}
	if l.step != nil {
		c.scan = l.step()
	}
	l.acceptMu.Lock()
	var victim *Entry[*Conn]
	var reason string
	c.entry, victim, reason = l.gate.Enter(c, SourceOf(nc))
	c.timer = time.AfterFunc(l.timeout, c.expire)
	if victim != nil {
		victim.Value().drop(reason)
	}
	l.acceptMu.Unlock()
	return c, nil
}

func (l *Listener) count(reason string) {
	if l.refused != nil {
		l.refused(reason)
	}
}

// Conn is a connection accepted by a Listener: half-open until its Step
// sees the first step done in what its server reads, until Pass, or until
// it is closed, evicted or timed out.
type Conn struct {
	net.Conn
	l     *Listener
	entry *Entry[*Conn] // set before the connection is handed out
	timer *time.Timer   // set before the connection is handed out
	out   atomic.Bool   // no longer half-open: passed, closed, evicted or timed out

	mu   sync.Mutex // guards scan (servers read from one goroutine; this makes sure)
	scan func([]byte) bool
}

// Read reads from the connection, and feeds the Step while it is
// half-open.
func (c *Conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && !c.out.Load() && c.scan != nil {
		c.mu.Lock()
		done := c.scan(p[:n])
		c.mu.Unlock()
		if done {
			c.Pass()
		}
	}
	return n, err
}

// Pass ends c's half-open time: its first step is done.
func (c *Conn) Pass() {
	if c.leave() {
		c.timer.Stop()
	}
}

// Close closes the connection (and ends its half-open time).
func (c *Conn) Close() error {
	c.Pass()
	return c.Conn.Close()
}

// NetConn is the accepted connection c wraps (as tls.Conn's NetConn), for
// code that needs its type: SO_PEERCRED of a *net.UnixConn.
func (c *Conn) NetConn() net.Conn { return c.Conn }

// leave takes c out of the gate, once; false: it was out already, or
// evicted. It does not touch c.timer: expire, which runs on the timer's
// goroutine, may not read it (Accept sets it after the timer is made).
func (c *Conn) leave() bool {
	if !c.out.CompareAndSwap(false, true) {
		return false
	}
	return c.l.gate.Leave(c.entry)
}

// expire closes c when its deadline passes while it is half-open.
func (c *Conn) expire() {
	if c.leave() {
		c.l.count(ReasonTimeout)
		_ = c.Conn.Close()
	}
}

// drop closes c, evicted by the gate (which has removed its entry); it
// runs under acceptMu, as the Accept that set c.timer did.
func (c *Conn) drop(reason string) {
	c.out.Store(true)
	c.timer.Stop()
	c.l.count(reason)
	_ = c.Conn.Close()
}

// Pass ends the half-open time of c when it is, or wraps (NetConn), a
// connection of a Listener: for protocols whose first step the listener
// cannot see, such as a TLS handshake.
func Pass(c net.Conn) {
	for c != nil {
		if gc, ok := c.(*Conn); ok {
			gc.Pass()
			return
		}
		nc, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return
		}
		c = nc.NetConn()
	}
}

// Unwrap is the connection a Listener accepted under c (c itself when it
// is not a Conn).
func Unwrap(c net.Conn) net.Conn {
	if gc, ok := c.(*Conn); ok {
		return gc.Conn
	}
	return c
}
