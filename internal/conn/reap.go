package conn

import (
	"time"
)

// RequesterActivity is what the holder's lock table knows of a requester
// node (*holder.LockTable): its live transfer sessions, and how long ago
// it last asked for one. A verbs QP cannot tell the reaper whether its
// requester still reads (the HCA serves READs without software), but a
// requester reads only under sessions it holds: one with none for the
// idle time is gone, or will handshake again when it next needs to.
type RequesterActivity interface {
	RequesterActivity(nodeID string) (live int, idle time.Duration)
}

// SetRequesterActivity gives the reaper the holder's view of requester
// sessions, by which it reaps the connections of providers that do not
// report their data connections (verbs). Until it is set, such
// connections go only by disconnect, restart, drain time or Close.
func (acc *Acceptor) SetRequesterActivity(a RequesterActivity) {
	acc.activity.Store(&a)
}

// requesterIdle reports whether node has had no live session for d, by
// the holder's lock table (false when none was set).
func (acc *Acceptor) requesterIdle(node string, d time.Duration) bool {
	a := acc.activity.Load()
	if a == nil {
		return false
	}
	live, idle := (*a).RequesterActivity(node)
	return live == 0 && idle >= d
}

// Holder-side lifetimes of accepted connections whose requester does not
// say goodbye (no RdmaDisconnect): it was killed, its host died, or it
// reconnected while READs of the old connection were still running.
const (
	// defaultIdleTimeout: an accepted connection with no data connection
	// open on any of its QPs, and none opened, closed or used for this
	// long, belongs to a requester that is gone.
	defaultIdleTimeout = 60 * time.Second
	// defaultReconnectDrain bounds how long a retired generation (replaced
	// by a reconnect of the same requester process) keeps serving the
	// READs that were in flight on it.
	defaultReconnectDrain = 30 * time.Second
	// maxRetiredPerNode bounds the generations one requester can keep
	// alive by reconnecting over and over; the oldest goes first.
	maxRetiredPerNode = 4
)

// Reasons of the AcceptedReaped metric (and of Invalidations).
const (
	reapIdle    = "idle"
	reapDrained = "drain_timeout"
)

// activityReporter is implemented by QPs of providers that see their data
// connections (the tcp provider). A verbs QP does not: the holder's HCA
// serves READs without software, so such a connection is reaped as idle
// by its requester's sessions instead (RequesterActivity).
type activityReporter interface {
	DataActivity() (open int, last time.Time, used bool)
}

// prewarmer is implemented by QPs of providers that open their data path
// lazily (the tcp provider dials on the first work request): the
// requester asks for it right after the handshake, so that a live
// requester holds its data connections open and only a gone one leaves a
// holder's accepted connection without any (idleAt).
type prewarmer interface{ Prewarm() }

// idleAt reports whether a was idle at now for at least d: it is older
// than d, and none of its QPs has a data connection open, and none
// opened, closed or carried anything within d. A connection never used is
// idle too (its requester died between the handshake and its first READ):
// a live requester dials its data connections right after the handshake
// (Prewarm) and keeps them open while it lives, so a connection with none
// for d has nobody behind it. Where a QP cannot tell (verbs), the
// requester's sessions decide: none live, and none asked for, within d.
//
// It takes each QP's own lock (DataActivity, and qpPair.mu so that a QP
// being destroyed meanwhile is skipped, never touched); the caller must
// not hold acc.mu.
func (a *acceptedConn) idleAt(now time.Time, d time.Duration) bool {
	if now.Sub(a.since) < d {
		return false
	}
	unknown := false
	for _, qs := range a.nics {
		for _, p := range qs {
			idle, known := p.idleAt(now, d)
			if known && !idle {
				return false
			}
			unknown = unknown || !known
		}
	}
	return !unknown || a.acc.requesterIdle(a.nodeID, d)
}

// idleAt reports whether p's provider sees no data connection open on it
// and none opened, closed or used within d; known is false for a QP of a
// provider that cannot tell (verbs). A destroyed QP counts as idle (its
// connection is on its way out).
func (p *qpPair) idleAt(now time.Time, d time.Duration) (idle, known bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.destroyed {
		return true, true
	}
	ar, ok := p.qp.(activityReporter)
	if !ok {
		return false, false
	}
	open, last, _ := ar.DataActivity()
	return open == 0 && now.Sub(last) >= d, true
}

// retireLocked keeps old (replaced by a newer handshake of the same
// requester process) until it drains, and returns the generations of the
// node beyond maxRetiredPerNode, oldest first, for the caller to destroy
// outside acc.mu.
func (acc *Acceptor) retireLocked(old *acceptedConn, now time.Time) []*acceptedConn {
	if acc.retired == nil {
		acc.retired = make(map[*acceptedConn]time.Time)
	}
	old.retired = true
	acc.retired[old] = now
	acc.met.Conns.WithLabelValues(RoleHolder, StateConnected).Dec()
	acc.met.Conns.WithLabelValues(RoleHolder, StateInvalidated).Inc()
	var gens []*acceptedConn
	for r := range acc.retired {
		if r.nodeID == old.nodeID {
			gens = append(gens, r)
		}
	}
	var out []*acceptedConn
	for len(gens) > maxRetiredPerNode {
		oldest := 0
		for i, g := range gens {
			if acc.retired[g].Before(acc.retired[gens[oldest]]) {
				oldest = i
			}
		}
		out = append(out, gens[oldest])
		delete(acc.retired, gens[oldest])
		gens = append(gens[:oldest], gens[oldest+1:]...)
	}
	return out
}

// dropRetiredLocked removes every retired generation of node (its
// requester restarted: none of them has a reader left) and returns them
// for the caller to destroy outside acc.mu.
func (acc *Acceptor) dropRetiredLocked(node string) []*acceptedConn {
	var out []*acceptedConn
	for r := range acc.retired {
		if r.nodeID == node {
			out = append(out, r)
			delete(acc.retired, r)
		}
	}
	return out
}

// retiredLocked finds the retired generation of node made by handshake
// hsID of incarnation inc.
func (acc *Acceptor) retiredLocked(node, hsID, inc string) *acceptedConn {
	for r := range acc.retired {
		if r.nodeID == node && r.handshakeID == hsID && r.incarnation == inc {
			return r
		}
	}
	return nil
}

// reapEvery is the reaper's period: a quarter of the shorter lifetime,
// so a connection outlives its bound by at most that much.
func (acc *Acceptor) reapEvery() time.Duration {
	return min(max(min(acc.opts.IdleTimeout, acc.opts.ReconnectDrain)/4, 5*time.Millisecond), 5*time.Second)
}

// reaper tears down accepted connections whose requester is gone (idle)
// and retired generations past their drain time. Owned by the acceptor:
// started by NewAcceptor, stopped by Close (acc.ctx), counted in
// acc.reaping.
func (acc *Acceptor) reaper() {
	defer acc.reaping.Done()
	tick(acc.ctx, acc.reapEvery(), acc.reap)
}

// reap is one pass of the reaper. It snapshots the candidates under acc.mu,
// checks their QPs' activity without it (each check takes the QP's own
// lock, which a slow provider call may hold: handshakes, disconnects and
// lookups must not wait for that), then removes, under acc.mu again, only
// the victims still installed as they were when checked (a reconnect or a
// disconnect meanwhile wins; the next pass looks again).
func (acc *Acceptor) reap(now time.Time) {
	type victim struct {
		a      *acceptedConn
		reason string
		at     time.Time // when it was retired; zero for an installed one
	}
	acc.mu.Lock()
	if acc.closed {
		acc.mu.Unlock()
		return
	}
	cands := make([]victim, 0, len(acc.accepted)+len(acc.retired))
	for _, a := range acc.accepted {
		cands = append(cands, victim{a: a})
	}
	for a, at := range acc.retired {
		cands = append(cands, victim{a: a, at: at})
	}
	acc.mu.Unlock()

	var vs []victim
	for _, c := range cands {
		switch {
		case c.a.idleAt(now, acc.opts.IdleTimeout):
			c.reason = reapIdle
		case !c.at.IsZero() && now.Sub(c.at) >= acc.opts.ReconnectDrain:
			c.reason = reapDrained
		default:
			continue
		}
		vs = append(vs, c)
	}
	if len(vs) == 0 {
		return
	}

	acc.mu.Lock()
	if acc.closed { // Close destroys everything that was installed
		acc.mu.Unlock()
		return
	}
	n := 0
	for _, v := range vs {
		if v.at.IsZero() {
			if acc.accepted[v.a.nodeID] != v.a {
				continue // retired, replaced or disconnected meanwhile
			}
			delete(acc.accepted, v.a.nodeID)
		} else {
			if at, ok := acc.retired[v.a]; !ok || !at.Equal(v.at) {
				continue
			}
			delete(acc.retired, v.a)
		}
		vs[n] = v
		n++
	}
	vs = vs[:n]
	acc.mu.Unlock()
	for _, v := range vs {
		n := v.a.qpCount()
		v.a.destroy(v.reason)
		acc.met.AcceptedReaped.WithLabelValues(v.reason).Inc()
		acc.log.Info().Str("peer", v.a.remoteAddr).Str("remote_node", v.a.nodeID).Str("session", v.a.handshakeID).
			Str("reason", v.reason).Int("qps", n).Msg("accepted rdma connection reaped")
	}
}
