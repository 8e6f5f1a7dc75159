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
func (m *Manager) SetRequesterActivity(a RequesterActivity) {
	m.activity.Store(&a)
}

// requesterIdle reports whether node has had no live session for d, by
// the holder's lock table (false when none was set).
func (m *Manager) requesterIdle(node string, d time.Duration) bool {
	a := m.activity.Load()
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
// not hold m.mu.
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
	return !unknown || a.m.requesterIdle(a.nodeID, d)
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
// outside mu.
func (m *Manager) retireLocked(old *acceptedConn, now time.Time) []*acceptedConn {
	if m.retired == nil {
		m.retired = make(map[*acceptedConn]time.Time)
	}
	old.retired = true
	m.retired[old] = now
	m.met.Conns.WithLabelValues(RoleHolder, StateConnected).Dec()
	m.met.Conns.WithLabelValues(RoleHolder, StateInvalidated).Inc()
	var gens []*acceptedConn
	for r := range m.retired {
		if r.nodeID == old.nodeID {
			gens = append(gens, r)
		}
	}
	var out []*acceptedConn
	for len(gens) > maxRetiredPerNode {
		oldest := 0
		for i, g := range gens {
			if m.retired[g].Before(m.retired[gens[oldest]]) {
				oldest = i
			}
		}
		out = append(out, gens[oldest])
		delete(m.retired, gens[oldest])
		gens = append(gens[:oldest], gens[oldest+1:]...)
	}
	return out
}

// dropRetiredLocked removes every retired generation of node (its
// requester restarted: none of them has a reader left) and returns them
// for the caller to destroy outside mu.
func (m *Manager) dropRetiredLocked(node string) []*acceptedConn {
	var out []*acceptedConn
	for r := range m.retired {
		if r.nodeID == node {
			out = append(out, r)
			delete(m.retired, r)
		}
	}
	return out
}

// retiredLocked finds the retired generation of node made by handshake
// hsID of incarnation inc.
func (m *Manager) retiredLocked(node, hsID, inc string) *acceptedConn {
	for r := range m.retired {
		if r.nodeID == node && r.handshakeID == hsID && r.incarnation == inc {
			return r
		}
	}
	return nil
}

// reapEvery is the reaper's period: a quarter of the shorter lifetime,
// so a connection outlives its bound by at most that much.
func (m *Manager) reapEvery() time.Duration {
	return min(max(min(m.opts.IdleTimeout, m.opts.ReconnectDrain)/4, 5*time.Millisecond), 5*time.Second)
}

// reaper tears down accepted connections whose requester is gone (idle)
// and retired generations past their drain time. Owned by the manager:
// started by NewManager, stopped by Close (m.ctx), counted in m.reaping.
func (m *Manager) reaper() { m.tick(m.reapEvery(), m.reap) }

// tick runs f every interval until Close (m.ctx); it is the body of the
// manager's background goroutines, counted in m.reaping.
func (m *Manager) tick(every time.Duration, f func(now time.Time)) {
	defer m.reaping.Done()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case now := <-t.C:
			f(now)
		}
	}
}

// reap is one pass of the reaper. It snapshots the candidates under m.mu,
// checks their QPs' activity without it (each check takes the QP's own
// lock, which a slow provider call may hold: handshakes, disconnects and
// lookups must not wait for that), then removes, under m.mu again, only
// the victims still installed as they were when checked (a reconnect or a
// disconnect meanwhile wins; the next pass looks again).
func (m *Manager) reap(now time.Time) {
	type victim struct {
		a      *acceptedConn
		reason string
		at     time.Time // when it was retired; zero for an installed one
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	cands := make([]victim, 0, len(m.accepted)+len(m.retired))
	for _, a := range m.accepted {
		cands = append(cands, victim{a: a})
	}
	for a, at := range m.retired {
		cands = append(cands, victim{a: a, at: at})
	}
	m.mu.Unlock()

	var vs []victim
	for _, c := range cands {
		switch {
		case c.a.idleAt(now, m.opts.IdleTimeout):
			c.reason = reapIdle
		case !c.at.IsZero() && now.Sub(c.at) >= m.opts.ReconnectDrain:
			c.reason = reapDrained
		default:
			continue
		}
		vs = append(vs, c)
	}
	if len(vs) == 0 {
		return
	}

	m.mu.Lock()
	if m.closed { // Close destroys everything that was installed
		m.mu.Unlock()
		return
	}
	n := 0
	for _, v := range vs {
		if v.at.IsZero() {
			if m.accepted[v.a.nodeID] != v.a {
				continue // retired, replaced or disconnected meanwhile
			}
			delete(m.accepted, v.a.nodeID)
		} else {
			if at, ok := m.retired[v.a]; !ok || !at.Equal(v.at) {
				continue
			}
			delete(m.retired, v.a)
		}
		vs[n] = v
		n++
	}
	vs = vs[:n]
	m.mu.Unlock()
	for _, v := range vs {
		n := v.a.qpCount()
		v.a.destroy(v.reason)
		m.met.AcceptedReaped.WithLabelValues(v.reason).Inc()
		m.log.Info().Str("peer", v.a.remoteAddr).Str("remote_node", v.a.nodeID).Str("session", v.a.handshakeID).
			Str("reason", v.reason).Int("qps", n).Msg("accepted rdma connection reaped")
	}
}
