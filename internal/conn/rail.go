package conn

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/ibv"
)

// One rail down must not take the node down. A NIC whose port goes down
// (a cable, a switch port, `ip link set down` under soft-RoCE) is taken
// out of placement: handshakes leave it out, the holder pairs no
// requester NIC with it, and the QPs that connections have on it are moved
// to ERROR so that READs stuck on it complete (flushed) at once instead of
// waiting out the QP's retry budget, which rxe's retry_cnt 7 makes
// unbounded. A flushed READ is "innocent" to the requester, which reads
// the window again on a fresh connection built over the other NICs. When
// the port is ACTIVE again, connections made without the NIC are
// replaced (they drain their in-flight READs first), so the rail carries
// again from the next fetch on. A handshake can meet the rail before its
// event does: a QP whose connect fails on it (railFault) is left out, and
// the handshake made again over the other rails.

// railCheck looks at a Read's first failure: a work completion in error
// (not a flush) on a NIC whose port is no longer ACTIVE means the rail went
// down under it. rxe fails such READs at once (local QP operation error)
// when its netdev goes down, before the port's event reaches us. The NIC is
// taken out of placement now (the event, when it comes, finds it done) and
// the error wraps ErrRailDown, which the requester retries. The port is
// asked a few times over 100 ms: the kernel marks it down just after the
// transmit that failed. Any other error is returned as it is.
func (c *AddrConnection) railCheck(err error) error {
	var se *ibv.StatusError
	if !errors.As(err, &se) || se.Status == ibv.WCWRFlushErr {
		return err
	}
	n := c.nicOfQP(se.QPN)
	if n == nil || !portWentDown(n) {
		return err
	}
	c.d.nics.railDown(n, c.d.log.With().Str("nic", n.info.Name).Str("event", "read_failed").Logger())
	return fmt.Errorf("%w: %s: %w", ErrRailDown, n.info.Name, err)
}

// portWentDown reports whether n's port has left ACTIVE, asking a few
// times over 100 ms: the kernel marks it down just after the transmit or
// route lookup that failed. False when the device cannot tell.
func portWentDown(n *localNIC) bool {
	ps, ok := n.dev.(ibv.PortStater)
	if !ok {
		return false
	}
	for i := range 5 {
		if i > 0 {
			time.Sleep(20 * time.Millisecond)
		}
		if active, err := ps.PortActive(); err == nil && !active {
			return true
		}
	}
	return false
}

// RailFaultError is a handshake's QP that could not be connected on one
// local NIC for a fault of that NIC's rail: its port is down, or the
// provider found no route from it (ENETUNREACH, EHOSTUNREACH, ENETDOWN,
// EADDRNOTAVAIL from ibv_modify_qp: rxe resolves the peer's GID through
// the netdev's routes). It says nothing of the peer or the other rails,
// so Dialer.Get handshakes again without the NIC; a caller sees these
// only when no rail connected, in an error wrapping ErrConnectionBroken
// and ErrNoRail.
type RailFaultError struct {
	NIC  string
	Rail string // as named in NICOptions.Rails; "" when not named
	// PortDown: the port queried down, so the NIC was taken out of
	// placement (as its port-down event, which may come later, does).
	PortDown bool
	Err      error
	nic      *localNIC
}

func (e *RailFaultError) Error() string { return "rail fault on " + e.desc() }

func (e *RailFaultError) Unwrap() error { return e.Err }

// desc is the NIC, its rail and whether its port was down, then the error.
func (e *RailFaultError) desc() string {
	var tags []string
	if e.Rail != "" {
		tags = append(tags, "rail "+e.Rail)
	}
	if e.PortDown {
		tags = append(tags, "port down")
	}
	s := e.NIC
	if len(tags) > 0 {
		s += " (" + strings.Join(tags, ", ") + ")"
	}
	return s + ": " + e.Err.Error()
}

// railFaults are the rail faults of one connect, in the order the rails
// were tried.
type railFaults []*RailFaultError

func (f railFaults) Error() string {
	s := make([]string, len(f))
	for i, e := range f {
		s[i] = e.desc()
	}
	return "tried " + strings.Join(s, "; ")
}

func (f railFaults) Unwrap() []error {
	out := make([]error, len(f))
	for i, e := range f {
		out[i] = e
	}
	return out
}

// routeErrnos are the errors of a QP's connect that blame the local NIC's
// path, not the peer.
var routeErrnos = []error{syscall.ENETUNREACH, syscall.EHOSTUNREACH, syscall.ENETDOWN, syscall.EADDRNOTAVAIL}

// railFault classifies err, the failed connect of a QP on n: a
// *RailFaultError when the port is down (whatever the errno: the QP may
// have been moved to ERROR under the connect) or the error is a route
// error; nil otherwise. A port found down takes n out of placement now,
// so no later handshake offers it until its port is ACTIVE again. A
// route error on a port still ACTIVE only leaves n out of this connect:
// it may be a neighbour that is not resolved yet.
func (d *Dialer) railFault(n *localNIC, err error) *RailFaultError {
	down := portWentDown(n)
	route := false
	for _, e := range routeErrnos {
		route = route || errors.Is(err, e)
	}
	if !down && !route {
		return nil
	}
	if down {
		d.nics.railDown(n, d.log.With().Str("nic", n.info.Name).Str("event", "connect_failed").Logger())
	}
	return &RailFaultError{NIC: n.info.Name, Rail: n.rail, PortDown: down, Err: err, nic: n}
}

// upNICsBut returns the NICs whose port is up, in device order, less
// those in skip (the rails a connect found faulty).
func (s *NICs) upNICsBut(skip map[*localNIC]bool) []*localNIC {
	up := s.upNICs()
	out := up[:0]
	for _, n := range up {
		if !skip[n] {
			out = append(out, n)
		}
	}
	return out
}

// nicOfQP is the NIC of c's QP qpn; nil if c has none.
func (c *AddrConnection) nicOfQP(qpn uint32) *localNIC {
	for _, cn := range c.nics {
		for _, s := range cn.sessions {
			if s.p.qpn == qpn {
				return cn.nic
			}
		}
	}
	return nil
}

// upNICs returns the NICs whose port is up, in device order.
func (s *NICs) upNICs() []*localNIC {
	out := make([]*localNIC, 0, len(s.curNICs()))
	for _, n := range s.curNICs() {
		if !n.down.Load() {
			out = append(out, n)
		}
	}
	return out
}

// railDown takes n out of placement and flushes the READs through it.
// A second call (the port's event after railCheck found it down) has
// nothing left to do: connections made since leave n out. The connections
// are the Dialer's (none without one).
func (s *NICs) railDown(n *localNIC, log zerolog.Logger) {
	if n.down.Swap(true) {
		return
	}
	n.up.Set(0)
	d := s.dialer.Load()
	conns := d.requesterConns()
	log.Warn().Int("connections", len(conns)).Int("nics_up", len(s.upNICs())).
		Msg("nic port went down: out of placement; flushing its QPs and invalidating connections through it")
	reason := fmt.Errorf("%w: port of %s went down", ErrConnectionBroken, n.info.Name)
	for _, c := range conns {
		// Invalidate first: nothing new is posted on c, and the flush
		// below ends what is in flight on n (the other NICs' READs run
		// to completion).
		d.Invalidate(c, reason)
		c.flushNIC(n)
	}
}

// railUp puts n back into placement and replaces the connections that were
// made without it (the Dialer's).
func (s *NICs) railUp(n *localNIC, log zerolog.Logger) {
	if !n.down.Swap(false) {
		return // up already (a port-up without a port-down: nothing left out)
	}
	n.up.Set(1)
	d := s.dialer.Load()
	var stale []*AddrConnection
	for _, c := range d.requesterConns() {
		if !c.uses(n) {
			stale = append(stale, c)
		}
	}
	log.Info().Int("replaced", len(stale)).Msg("nic port is active again: back in placement")
	for _, c := range stale {
		d.Invalidate(c, fmt.Errorf("port of %s is active again: reconnect over every rail", n.info.Name))
	}
}

// uses reports whether c has QPs on n.
func (c *AddrConnection) uses(n *localNIC) bool {
	for _, cn := range c.nics {
		if cn.nic == n {
			return true
		}
	}
	return false
}

// flushNIC moves c's QPs on n to ERROR: their outstanding READs complete
// flushed, and their workers drain them. The rest of c is untouched.
func (c *AddrConnection) flushNIC(n *localNIC) {
	// Under mu: teardown (decided under mu) cannot destroy the QPs
	// meanwhile; toError skips a destroyed pair anyway.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.tornDown {
		return
	}
	for _, cn := range c.nics {
		if cn.nic != n {
			continue
		}
		for _, s := range cn.sessions {
			s.p.toError()
		}
	}
}
