package holder

// The lock table's requester nodes: each node's incarnations (a new one
// reclaims the sessions of older ones, an old one is refused), its live
// sessions and what they pin against the per-peer caps, and the eviction
// of nodes that hold nothing.

import (
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// nodeState tracks one requester node: its incarnations and its live
// sessions (for fast reclaim).
type nodeState struct {
	id string // immutable
	// gauge is the node's live-session gauge (metrics.RequesterSessions),
	// looked up once: a node keeps its label until it is forgotten, and
	// the lookup takes the metrics' lock. Immutable.
	gauge prometheus.Gauge

	mu       sync.Mutex  // guards all fields below
	current  string      // latest incarnation seen ("" until one is seen)
	past     []string    // older incarnations, oldest first, bounded
	sessions sessionList // live sessions, for reclaim
	pinned   uint64      // bytes of sessions, counted against Limits.PinnedBytesPerPeer
	lastSeen time.Time
	dead     bool // evicted from LockTable.nodes; callers must look up again
	// The interned incarnation records new sessions point to: none for
	// sessions without an incarnation, cur for those of current.
	none, cur *incarnation
}

// incarnationLocked is the interned record for a new session of
// incarnation inc, which observeLocked has just made "" or current.
func (n *nodeState) incarnationLocked(inc string) *incarnation {
	if inc == "" {
		if n.none == nil {
			n.none = &incarnation{node: n}
		}
		return n.none
	}
	if n.cur == nil || n.cur.inc != inc {
		n.cur = &incarnation{node: n, inc: inc}
	}
	return n.cur
}

// node returns the live state of nodeID, creating it.
func (t *LockTable) node(nodeID string, now time.Time) *nodeState {
	t.nodesMu.Lock()
	defer t.nodesMu.Unlock()
	n := t.nodes[nodeID]
	if n == nil {
		if t.maxNodes > 0 && len(t.nodes) >= t.scanAt {
			t.evictIdleNodesLocked(now)
		}
		n = &nodeState{id: nodeID, gauge: t.m.RequesterSessions(nodeID)}
		t.nodes[nodeID] = n
	}
	return n
}

// evictIdleNodesLocked forgets nodes with no live session, idle for longer
// than twice the maximum lifetime, so that requesters that come and go do
// not grow the map forever. It runs only when the map passes scanAt, which
// then doubles past what remains, so its cost is amortized.
func (t *LockTable) evictIdleNodesLocked(now time.Time) {
	cutoff := now.Add(-2 * t.maxLifetime)
	for id, n := range t.nodes {
		n.mu.Lock()
		if n.sessions.len() == 0 && n.lastSeen.Before(cutoff) {
			n.dead = true
			delete(t.nodes, id)
			t.m.ForgetRequester(id)
		}
		n.mu.Unlock()
	}
	t.scanAt = max(t.maxNodes, 2*len(t.nodes))
}

// lockNode returns nodeID's state locked; the caller unlocks n.mu.
func (t *LockTable) lockNode(nodeID string, now time.Time) *nodeState {
	for {
		n := t.node(nodeID, now)
		n.mu.Lock()
		if !n.dead {
			n.lastSeen = now
			return n
		}
		n.mu.Unlock()
	}
}

// observeLocked applies incarnation inc of the node held locked: an old one
// is ErrStaleIncarnation; a new one becomes current and the sessions of
// earlier incarnations are returned for reclaim (the caller ends them after
// unlocking). "" carries no incarnation and is never stale.
func (n *nodeState) observeLocked(inc string) (reclaim []*session, err error) {
	if inc == "" || inc == n.current {
		return nil, nil
	}
	for _, p := range n.past {
		if p == inc {
			return nil, fmt.Errorf("%w: %q, current is %q", ErrStaleIncarnation, inc, n.current)
		}
	}
	if n.current != "" {
		n.past = append(n.past, n.current)
		if len(n.past) > maxPastIncarnations {
			n.past = n.past[1:]
		}
	}
	n.current = inc
	for s := n.sessions.head; s != nil; s = s.next {
		if s.who.inc != "" && s.who.inc != inc {
			reclaim = append(reclaim, s)
		}
	}
	return reclaim, nil
}

// checkLocked is observeLocked without updating: for release and renew,
// which never introduce an incarnation.
func (n *nodeState) checkLocked(inc string) error {
	if inc == "" || inc == n.current {
		return nil
	}
	for _, p := range n.past {
		if p == inc {
			return fmt.Errorf("%w: %q, current is %q", ErrStaleIncarnation, inc, n.current)
		}
	}
	return nil
}

// ObserveIncarnation records that nodeID runs incarnation inc (from a query
// or a handshake). A new incarnation releases at once every session held by
// the node's earlier incarnations and returns how many; an incarnation
// older than one already seen is ErrStaleIncarnation.
func (t *LockTable) ObserveIncarnation(nodeID, inc string) (reclaimed int, err error) {
	if nodeID == "" || inc == "" {
		return 0, nil
	}
	return t.observeUnlock(t.lockNode(nodeID, t.clock.Now()), nodeID, inc)
}

// observeKnown is ObserveIncarnation for a node the table already tracks;
// it creates no state, so a query that pins nothing cannot grow the node
// table (a node it does not know holds no session to reclaim, and open
// checks the incarnation again when it does pin).
func (t *LockTable) observeKnown(nodeID, inc string) (reclaimed int, err error) {
	if nodeID == "" || inc == "" {
		return 0, nil
	}
	for {
		t.nodesMu.Lock()
		n := t.nodes[nodeID]
		t.nodesMu.Unlock()
		if n == nil {
			return 0, nil
		}
		n.mu.Lock()
		if n.dead {
			n.mu.Unlock()
			continue // evicted meanwhile: look again
		}
		return t.observeUnlock(n, nodeID, inc)
	}
}

// observeUnlock applies incarnation inc to n, whose mu the caller holds
// and this releases, then reclaims the sessions of the incarnations it
// replaced.
func (t *LockTable) observeUnlock(n *nodeState, nodeID, inc string) (reclaimed int, err error) {
	prev := n.current
	victims, err := n.observeLocked(inc)
	n.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return t.reclaim(nodeID, prev, inc, victims), nil
}

func (t *LockTable) reclaim(nodeID, prev, inc string, victims []*session) int {
	if len(victims) == 0 {
		return 0
	}
	ended, blocks := 0, 0
	for _, s := range victims {
		if t.end(s, EndReclaimed) {
			ended++
			blocks += len(s.blocks)
		}
	}
	if ended > 0 {
		t.m.IncarnationReclaim.Add(float64(ended))
		t.log.Warn().Str("requester", nodeID).Str("old_incarnation", prev).Str("incarnation", inc).
			Int("sessions", ended).Int("blocks", blocks).
			Msg("Requester restarted: released its old transfer locks")
	}
	return ended
}

// SessionOfQuery returns the wire id of owner's live session opened by its
// query with id query; ok false when there is none. It walks the owner's
// live sessions (bounded by Limits.SessionsPerPeer).
func (t *LockTable) SessionOfQuery(owner string, query uint64) (id string, ok bool) {
	if query == 0 {
		return "", false
	}
	t.nodesMu.Lock()
	n := t.nodes[owner]
	t.nodesMu.Unlock()
	if n == nil {
		return "", false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for s := n.sessions.head; s != nil; s = s.next {
		if s.query == query {
			return s.id.String(), true
		}
	}
	return "", false
}

func (t *LockTable) checkIncarnation(owner, inc string) error {
	if inc == "" {
		return nil
	}
	t.nodesMu.Lock()
	n := t.nodes[owner]
	t.nodesMu.Unlock()
	if n == nil {
		return nil
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.checkLocked(inc)
}

// RequesterActivity reports how many live sessions nodeID holds and how
// long ago it last locked, renewed, released or queried anything. A node
// never seen, or forgotten, has none and has been idle forever. The
// holder's connection reaper (conn.RequesterActivity) frees a verbs
// connection whose requester has had none for its idle time.
func (t *LockTable) RequesterActivity(nodeID string) (live int, idle time.Duration) {
	t.nodesMu.Lock()
	n := t.nodes[nodeID]
	t.nodesMu.Unlock()
	if n == nil {
		return 0, math.MaxInt64
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.dead {
		return 0, math.MaxInt64
	}
	return n.sessions.len(), t.clock.Now().Sub(n.lastSeen)
}
