package conn

import (
	"time"
)

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
// serves READs without software, so such connections are never reaped as
// idle and go by disconnect, restart, drain time or Close.
type activityReporter interface {
	DataActivity() (open int, last time.Time, used bool)
}

// idleAt reports whether a was idle at now for at least d: its requester
// opened data connections, all are closed now, and none opened, closed or
// carried anything within d. A connection never used is not idle: a live
// requester may hold it for a later fetch (it connects before it knows
// whether the holder has anything), and its data connections are dialed
// on the first READ; it goes by disconnect, restart or Close as before.
func (a *acceptedConn) idleAt(now time.Time, d time.Duration) bool {
	if now.Sub(a.since) < d {
		return false
	}
	used := false
	for _, qs := range a.nics {
		for _, p := range qs {
			ar, ok := p.qp.(activityReporter)
			if !ok {
				return false
			}
			open, last, u := ar.DataActivity()
			if open > 0 || now.Sub(last) < d {
				return false
			}
			used = used || u
		}
	}
	return used
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
func (m *Manager) reaper() {
	defer m.reaping.Done()
	t := time.NewTicker(m.reapEvery())
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case now := <-t.C:
			m.reap(now)
		}
	}
}

// reap is one pass of the reaper.
func (m *Manager) reap(now time.Time) {
	type victim struct {
		a      *acceptedConn
		reason string
	}
	var vs []victim
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	for node, a := range m.accepted {
		if a.idleAt(now, m.opts.IdleTimeout) {
			delete(m.accepted, node)
			vs = append(vs, victim{a, reapIdle})
		}
	}
	for a, at := range m.retired {
		switch {
		case a.idleAt(now, m.opts.IdleTimeout):
			vs = append(vs, victim{a, reapIdle})
		case now.Sub(at) >= m.opts.ReconnectDrain:
			vs = append(vs, victim{a, reapDrained})
		default:
			continue
		}
		delete(m.retired, a)
	}
	m.mu.Unlock()
	for _, v := range vs {
		n := v.a.qpCount()
		v.a.destroy(v.reason)
		m.met.AcceptedReaped.WithLabelValues(v.reason).Inc()
		m.log.Info().Str("peer", v.a.remoteAddr).Str("remote_node", v.a.nodeID).Str("session", v.a.handshakeID).
			Str("reason", v.reason).Int("qps", n).Msg("accepted rdma connection reaped")
	}
}
