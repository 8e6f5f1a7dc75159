package holder

import (
	"container/heap"
	"errors"
	"fmt"
	"math"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// Errors callers branch on. StatusKinds maps them to gRPC codes and
// pegaderr reasons at the RPC boundary, for the peer service and for the
// admin service's ForceRelease.
var (
	// ErrInvalidSessionID: not 32 hex characters. Maps to InvalidArgument.
	ErrInvalidSessionID = errors.New("malformed session id")
	// ErrUnknownSession: well-formed id that is not live (never seen, ended
	// long ago, or — for ForceRelease — ended already). Maps to NotFound.
	ErrUnknownSession = errors.New("unknown session")
	// ErrSessionEnded: the session ended recently (see EndReason in the
	// wrapped message). Renew maps it to NotFound.
	ErrSessionEnded = errors.New("session ended")
	// ErrNotOwner: the caller is not the requester that took the session.
	// Maps to PermissionDenied.
	ErrNotOwner = errors.New("session belongs to another requester")
	// ErrStaleIncarnation: the request carries an incarnation of its node
	// older than one already seen. Maps to FailedPrecondition.
	ErrStaleIncarnation = errors.New("stale requester incarnation")
	// ErrLifetimeExhausted: renewal refused, the session reached its maximum
	// lifetime (it stays live until its current deadline). Maps to
	// FailedPrecondition.
	ErrLifetimeExhausted = errors.New("session reached its maximum lifetime")
)

// EndReason says how a session ended; kept in tombstones so that a late
// ReleaseTransferLock learns what happened.
type EndReason uint8

const (
	EndReleased      EndReason = iota + 1 // released by its requester
	EndExpired                            // past its deadline (the GC sweeper, or whichever call found it lapsed first)
	EndForceReleased                      // ForceRelease by an operator
	EndReclaimed                          // its requester restarted (new incarnation)
	EndShutdown                           // ReleaseAll at daemon shutdown
	EndAbandoned                          // granted to a query whose caller had gone (answer not delivered)
)

func (r EndReason) String() string {
	switch r {
	case EndReleased:
		return "released"
	case EndExpired:
		return "expired"
	case EndForceReleased:
		return "force-released"
	case EndReclaimed:
		return "requester-restarted"
	case EndShutdown:
		return "shutdown"
	case EndAbandoned:
		return "abandoned"
	}
	return "unknown"
}

const (
	numShards = 64 // power of two; the shard is the id's first byte & (numShards-1)
	idLen     = 32 // hex characters of a 128-bit id
	// maxPastIncarnations bounds the per-node history used to tell an old
	// incarnation (rejected) from a new one (reclaims the old).
	maxPastIncarnations = 16
)

// SessionInfo is a listing row (pegactl sessions list).
type SessionInfo struct {
	ID          string
	RequesterID string
	Incarnation string
	Blocks      int
	Bytes       uint64
	CreatedAt   time.Time
	ExpiresAt   time.Time
	Renewals    int
	blocks      []*store.Block // immutable; for Locked
}

// shard holds the sessions whose id falls in it.
type shard struct {
	mu     sync.Mutex // guards live, expiry, tomb, ring, ringAt and the mutable fields of its sessions
	live   idTable
	expiry expiryHeap
	tomb   map[sessionID]tombstone
	ring   []sessionID // FIFO of tombstoned ids (zero: empty slot), bounds tomb
	ringAt int
}

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

// LockTable is the holder's table of transfer sessions. It is the only
// owner of the pins it takes: every session's blocks are unpinned exactly
// once, by whichever of release, expiry, force-release, reclaim or shutdown
// removes the session from its shard first (removal happens under the
// shard lock; the unpin after it, outside any lock).
//
// It never scans all sessions on the expiry path: each shard keeps a
// deadline heap, so ExpireBefore costs O(shards + k log n).
type LockTable struct {
	pins        Pinner
	m           *metrics.Metrics
	log         zerolog.Logger
	now         func() time.Time
	epoch       time.Time // now() when made; sessions' stamps count from it
	timeout     time.Duration
	maxLifetime time.Duration
	tombPerShd  int

	shards [numShards]shard

	nodesMu  sync.Mutex // guards nodes and scanAt
	nodes    map[string]*nodeState
	maxNodes int
	scanAt   int // len(nodes) at which the next idle-node sweep runs

	limits       Limits
	pinnedBytes  atomic.Uint64 // bytes of all live sessions, counted against limits.PinnedBytes
	liveSessions atomic.Int64
	lockedBlocks atomic.Int64
	openSeq      atomic.Uint64 // last session seq given out
}

func newLockTable(opts Options) *LockTable {
	t := &LockTable{
		pins:        opts.Store,
		m:           opts.Metrics,
		log:         opts.Log,
		now:         opts.Now,
		epoch:       opts.Now(),
		timeout:     opts.LockTimeout,
		maxLifetime: opts.MaxLifetime,
		tombPerShd:  (opts.Tombstones + numShards - 1) / numShards,
		nodes:       make(map[string]*nodeState),
		maxNodes:    opts.MaxRequesters,
		scanAt:      opts.MaxRequesters,
		limits:      opts.Limits,
	}
	t.m.SetOldestSessionAge(t.oldestAge)
	for i := range t.shards {
		t.shards[i].tomb = make(map[sessionID]tombstone)
		t.shards[i].ring = make([]sessionID, t.tombPerShd)
	}
	return t
}

func (t *LockTable) shardOf(id sessionID) *shard {
	return &t.shards[id[0]&(numShards-1)]
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
	return n.sessions.len(), t.now().Sub(n.lastSeen)
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
	n := t.lockNode(nodeID, t.now())
	prev := n.current
	victims, err := n.observeLocked(inc)
	n.mu.Unlock()
	if err != nil {
		return 0, err
	}
	return t.reclaim(nodeID, prev, inc, victims), nil
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
		prev := n.current
		victims, err := n.observeLocked(inc)
		n.mu.Unlock()
		if err != nil {
			return 0, err
		}
		return t.reclaim(nodeID, prev, inc, victims), nil
	}
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

// open creates a live session over blocks (already pinned by the caller,
// whose pins the table takes over on success). It applies the incarnation
// atomically with the insert, so a session of an old incarnation can never
// slip in after a reclaim.
func (t *LockTable) open(owner, inc string, blocks []*store.Block, bytes uint64) (*session, error) {
	return t.openQuery(owner, inc, 0, blocks, bytes)
}

// openQuery is open for the query with the requester's id query (0: none).
func (t *LockTable) openQuery(owner, inc string, query uint64, blocks []*store.Block, bytes uint64) (*session, error) {
	now := t.now()
	n := t.lockNode(owner, now)
	prev := n.current
	victims, err := n.observeLocked(inc)
	if err == nil {
		err = t.admitLocked(owner, n, bytes, victims)
	}
	if err != nil {
		n.mu.Unlock()
		// A refused query of a new incarnation has still made it current:
		// its old sessions are returned now or never (no later call sees
		// them as another incarnation's).
		t.reclaim(owner, prev, inc, victims)
		return nil, err
	}
	created := t.stamp(now)
	s := &session{
		who: n.incarnationLocked(inc), blocks: blocks, bytes: bytes, query: query,
		created: created, deadline: created + stamp(min(t.timeout, t.maxLifetime)), seq: t.openSeq.Add(1),
	}
	for {
		s.id = newID()
		sh := t.shardOf(s.id)
		sh.mu.Lock()
		_, dupTomb := sh.tomb[s.id]
		if sh.live.get(s.id) == nil && !dupTomb {
			sh.live.put(s)
			heap.Push(&sh.expiry, s)
			sh.mu.Unlock()
			break
		}
		sh.mu.Unlock()
	}
	n.sessions.push(s)
	n.mu.Unlock()

	t.liveSessions.Add(1)
	t.lockedBlocks.Add(int64(len(blocks)))
	t.m.SessionsActive.Inc()
	t.m.LockActive.Add(float64(len(blocks)))
	t.m.SessionsGranted.Inc()
	n.gauge.Inc()
	t.reclaim(owner, prev, inc, victims)
	return s, nil
}

// removeLocked takes s out of its shard and leaves a tombstone; sh.mu held.
func (t *LockTable) removeLocked(sh *shard, s *session, why EndReason) {
	sh.live.del(s.id)
	t.m.SessionEnds.WithLabelValues(why.outcome()).Inc()
	if s.heapIdx >= 0 {
		heap.Remove(&sh.expiry, int(s.heapIdx))
	}
	if t.tombPerShd > 0 {
		if old := sh.ring[sh.ringAt]; old != (sessionID{}) {
			delete(sh.tomb, old)
		}
		sh.ring[sh.ringAt] = s.id
		sh.ringAt = (sh.ringAt + 1) % t.tombPerShd
		sh.tomb[s.id] = tombstone{owner: s.owner(), end: why}
	}
}

// finish does what follows a removal, outside the shard lock: unpin (the
// single unpin of this session), gauges, and the node's session set. The
// node state is the session's own: a node with live sessions is never
// forgotten (evictIdleNodesLocked).
func (t *LockTable) finish(s *session) {
	t.pins.Unpin(s.blocks)
	t.liveSessions.Add(-1)
	t.lockedBlocks.Add(-int64(len(s.blocks)))
	t.m.SessionsActive.Dec()
	t.m.LockActive.Sub(float64(len(s.blocks)))
	n := s.who.node
	n.gauge.Dec()
	n.mu.Lock()
	n.sessions.remove(s)
	t.unadmit(n, s)
	n.mu.Unlock()
}

// lapsed is the one rule of when a lease is over: at its deadline,
// whether or not the sweeper has ticked since. Every path that finds a
// session (release, renew, force-release, end, listings, the sweeper)
// asks this, so none treats a lapsed lease as live.
func (s *session) lapsed(nowS stamp) bool { return s.deadline <= nowS }

// liveLocked returns id's session if its lease still runs at nowS. A
// session whose lease has lapsed is removed here as expired and returned
// in lapsed instead: the caller hands it to t.expired once sh.mu is
// unlocked (gone does both). sh.mu held.
func (t *LockTable) liveLocked(sh *shard, id sessionID, nowS stamp) (s, lapsed *session) {
	s = sh.live.get(id)
	if s != nil && s.lapsed(nowS) {
		t.removeLocked(sh, s, EndExpired)
		return nil, s
	}
	return s, nil
}

// gone says how id, not live, ended: as lapsed when liveLocked has just
// expired it (which gone then finishes), else from its tombstone (false
// when none is remembered). Called with sh.mu held; returns with it
// unlocked.
func (t *LockTable) gone(sh *shard, id sessionID, lapsed *session, now time.Time) (tombstone, bool) {
	ts, ok := sh.tomb[id]
	sh.mu.Unlock()
	if lapsed != nil {
		t.expired(lapsed, now)
		return tombstone{owner: lapsed.owner(), end: EndExpired}, true
	}
	return ts, ok
}

// end removes s if it is still live; true when this call removed it (and
// so unpinned it) for why. A session whose lease had lapsed ends as
// expired instead, and end reports false.
func (t *LockTable) end(s *session, why EndReason) bool {
	now := t.now()
	sh := t.shardOf(s.id)
	sh.mu.Lock()
	live, lapsed := t.liveLocked(sh, s.id, t.stamp(now))
	if live != s {
		t.gone(sh, s.id, lapsed, now)
		return false
	}
	t.removeLocked(sh, s, why)
	sh.mu.Unlock()
	t.finish(s)
	return true
}

// ReleaseResult is what a release did.
type ReleaseResult struct {
	Released int       // blocks unpinned by this call
	WasLive  bool      // this call ended a live session
	End      EndReason // how the session ended (EndReleased when WasLive)
	Age      time.Duration
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

// Release ends session id on behalf of its requester owner. A session
// that ended recently answers from its tombstone (Released 0, WasLive
// false). inc, when set, must not be a stale incarnation of owner.
func (t *LockTable) Release(wireID, owner, inc string) (ReleaseResult, error) {
	id, err := parseID(wireID)
	if err != nil {
		return ReleaseResult{}, err
	}
	if err := t.checkIncarnation(owner, inc); err != nil {
		return ReleaseResult{}, err
	}
	now := t.now()
	sh := t.shardOf(id)
	sh.mu.Lock()
	s, lapsed := t.liveLocked(sh, id, t.stamp(now))
	if s != nil {
		if s.owner() != owner {
			sh.mu.Unlock()
			return ReleaseResult{}, fmt.Errorf("%w: session %s", ErrNotOwner, id)
		}
		t.removeLocked(sh, s, EndReleased)
		sh.mu.Unlock()
		t.finish(s)
		return ReleaseResult{Released: len(s.blocks), WasLive: true, End: EndReleased, Age: now.Sub(t.at(s.created))}, nil
	}
	ts, ok := t.gone(sh, id, lapsed, now)
	if !ok {
		return ReleaseResult{}, fmt.Errorf("%w: %s", ErrUnknownSession, id)
	}
	if ts.owner != owner {
		return ReleaseResult{}, fmt.Errorf("%w: session %s", ErrNotOwner, id)
	}
	r := ReleaseResult{End: ts.end}
	if lapsed != nil {
		// What was read under it may be stale: the answer says EXPIRED.
		r.Age = now.Sub(t.at(lapsed.created))
	}
	return r, nil
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

// Renew extends live session id to now+LockTimeout, never past its
// creation + MaxLifetime. ErrLifetimeExhausted when no extension is left.
func (t *LockTable) Renew(wireID, owner, inc string) (expires time.Time, lifetimeLeft time.Duration, err error) {
	id, err := parseID(wireID)
	if err != nil {
		return time.Time{}, 0, err
	}
	if err := t.checkIncarnation(owner, inc); err != nil {
		return time.Time{}, 0, err
	}
	now := t.now()
	nowS := t.stamp(now)
	sh := t.shardOf(id)
	sh.mu.Lock()
	s, lapsed := t.liveLocked(sh, id, nowS)
	if s == nil {
		// Not live, lapsed included: a renewal must not revive it.
		ts, ok := t.gone(sh, id, lapsed, now)
		switch {
		case !ok:
			return time.Time{}, 0, fmt.Errorf("%w: %s", ErrUnknownSession, id)
		case ts.owner != owner:
			return time.Time{}, 0, fmt.Errorf("%w: session %s", ErrNotOwner, id)
		}
		return time.Time{}, 0, fmt.Errorf("%w: session %s %s", ErrSessionEnded, id, ts.end)
	}
	defer sh.mu.Unlock()
	if s.owner() != owner {
		return time.Time{}, 0, fmt.Errorf("%w: session %s", ErrNotOwner, id)
	}
	limit := s.created + stamp(t.maxLifetime)
	if nowS >= limit || s.deadline >= limit {
		return time.Time{}, 0, fmt.Errorf("%w: session %s created %s ago, maximum %s; live until %s",
			ErrLifetimeExhausted, id, time.Duration(nowS-s.created).Round(time.Millisecond), t.maxLifetime,
			t.at(s.deadline).UTC().Format(time.RFC3339Nano))
	}
	nd := min(nowS+stamp(t.timeout), limit)
	if nd > s.deadline {
		s.deadline = nd
		heap.Fix(&sh.expiry, int(s.heapIdx))
	}
	s.renewed()
	t.m.LockRenewals.Inc()
	return t.at(s.deadline), time.Duration(limit - nowS), nil
}

// ExpireBefore ends every session whose deadline is not after now and
// returns how many. It locks each shard briefly and pops only expired
// entries: O(shards + k log n) for k expired of n live.
func (t *LockTable) ExpireBefore(now time.Time) int {
	var expired []*session
	nowS := t.stamp(now)
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for len(sh.expiry) > 0 && sh.expiry[0].lapsed(nowS) {
			s := sh.expiry[0]
			t.removeLocked(sh, s, EndExpired)
			expired = append(expired, s)
		}
		sh.mu.Unlock()
	}
	for _, s := range expired {
		t.expired(s, now)
	}
	return len(expired)
}

// expired finishes s, just removed with EndExpired by the sweeper or by a
// release or renewal that found it past its deadline.
func (t *LockTable) expired(s *session, now time.Time) {
	t.finish(s)
	t.m.LockTimeouts.Inc()
	t.log.Warn().Stringer("session", s.id).Str("requester", s.owner()).Str("incarnation", s.incarnation()).
		Int("blocks", len(s.blocks)).Uint64("bytes", s.bytes).Dur("age", now.Sub(t.at(s.created))).
		Int32("renewals", s.renewals).Msg("Transfer lock expired")
}

// ForceRelease ends live session id for an operator; logged with who.
// ErrUnknownSession when it is not live (the message says how it ended
// when that is still remembered); a lapsed lease ends as expired, not
// force-released.
func (t *LockTable) ForceRelease(wireID, operator string) (released int, err error) {
	code := "OK"
	defer func() { t.m.HolderRPC.WithLabelValues(metrics.RPCForceRelease, code).Inc() }()
	id, err := parseID(wireID)
	if err != nil {
		code = "InvalidArgument"
		return 0, err
	}
	now := t.now()
	sh := t.shardOf(id)
	sh.mu.Lock()
	s, lapsed := t.liveLocked(sh, id, t.stamp(now))
	if s == nil {
		ts, ok := t.gone(sh, id, lapsed, now)
		code = "NotFound"
		if ok {
			return 0, fmt.Errorf("%w: %s already ended (%s)", ErrUnknownSession, id, ts.end)
		}
		return 0, fmt.Errorf("%w: %s", ErrUnknownSession, id)
	}
	t.removeLocked(sh, s, EndForceReleased)
	sh.mu.Unlock()
	t.finish(s)
	t.m.LockForceReleases.Inc()
	t.log.Warn().Stringer("session", id).Str("operator", operator).Str("requester", s.owner()).
		Int("blocks", len(s.blocks)).Dur("age", now.Sub(t.at(s.created))).Msg("Transfer lock force-released")
	return len(s.blocks), nil
}

// ReleaseAll ends every live session (daemon shutdown) and returns how
// many; late releases answer FORCE_RELEASED.
func (t *LockTable) ReleaseAll(reason string) int {
	var all []*session
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		first := len(all)
		sh.live.each(func(s *session) { all = append(all, s) })
		for _, s := range all[first:] { // not while walking the table
			t.removeLocked(sh, s, EndShutdown)
		}
		sh.mu.Unlock()
	}
	blocks := 0
	for _, s := range all {
		t.finish(s)
		blocks += len(s.blocks)
	}
	if len(all) > 0 {
		t.log.Info().Str("reason", reason).Int("sessions", len(all)).Int("blocks", blocks).Msg("Released all transfer locks")
	}
	return len(all)
}

// Sessions snapshots the live sessions (not lapsed ones the sweeper has
// yet to end), oldest first.
func (t *LockTable) Sessions() []SessionInfo {
	out := make([]SessionInfo, 0, t.Len())
	nowS := t.stamp(t.now())
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		sh.live.each(func(s *session) {
			if !s.lapsed(nowS) { // over, though not swept yet: not live
				out = append(out, t.infoLocked(s))
			}
		})
		sh.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].CreatedAt.Before(out[j].CreatedAt)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// SessionsPage lists up to limit (> 0) live sessions (not lapsed ones the
// sweeper has yet to end) opened after cursor (0: from the first), oldest
// first; next is the cursor of the following page, 0 on the last. Each
// shard is locked only while its sessions past the cursor are offered to
// a bounded heap of the limit+1 oldest, so a page costs O(n log limit)
// time and O(limit) memory, and no lock is held across shards.
func (t *LockTable) SessionsPage(cursor uint64, limit int) (page []SessionInfo, next uint64) {
	limit = max(limit, 1)
	h := make(pageHeap, 0, limit+1)
	nowS := t.stamp(t.now())
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		sh.live.each(func(s *session) {
			if s.seq <= cursor || s.lapsed(nowS) || (len(h) == limit+1 && s.seq >= h[0].seq) {
				return
			}
			row := pageRow{seq: s.seq, info: t.infoLocked(s)}
			if len(h) == limit+1 {
				h[0] = row
				heap.Fix(&h, 0)
			} else {
				heap.Push(&h, row)
			}
		})
		sh.mu.Unlock()
	}
	sort.Slice(h, func(i, j int) bool { return h[i].seq < h[j].seq })
	if len(h) > limit {
		h = h[:limit]
		next = h[limit-1].seq
	}
	page = make([]SessionInfo, len(h))
	for i, r := range h {
		page[i] = r.info
	}
	return page, next
}

// infoLocked is s's listing row; its shard's mu held.
func (t *LockTable) infoLocked(s *session) SessionInfo {
	return SessionInfo{
		ID: s.id.String(), RequesterID: s.owner(), Incarnation: s.incarnation(),
		Blocks: len(s.blocks), Bytes: s.bytes, CreatedAt: t.at(s.created),
		ExpiresAt: t.at(s.deadline), Renewals: int(s.renewals), blocks: s.blocks,
	}
}

type pageRow struct {
	seq  uint64
	info SessionInfo
}

// pageHeap is a max-heap by seq: its top is the newest row kept.
type pageHeap []pageRow

func (h pageHeap) Len() int           { return len(h) }
func (h pageHeap) Less(i, j int) bool { return h[i].seq > h[j].seq }
func (h pageHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *pageHeap) Push(x any)        { *h = append(*h, x.(pageRow)) }
func (h *pageHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	*h = old[:len(old)-1]
	return r
}

// Len is the number of live sessions.
func (t *LockTable) Len() int { return int(t.liveSessions.Load()) }

// LockedBlocks is the number of block pins held by live sessions (a block
// in two sessions counts twice).
func (t *LockTable) LockedBlocks() int { return int(t.lockedBlocks.Load()) }
