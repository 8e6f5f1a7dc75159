package holder

import (
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/lease"
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

// shard holds the sessions whose id falls in it.
type shard struct {
	mu     sync.Mutex // guards live, expiry, tomb, ring, ringAt and the mutable fields of its sessions
	live   idTable
	expiry lease.Queue[*session]
	tomb   map[sessionID]tombstone
	ring   []sessionID // FIFO of tombstoned ids (zero: empty slot), bounds tomb
	ringAt int
}

// LockTable is the holder's table of transfer sessions. It is the only
// owner of the pins it takes: every session's blocks are unpinned exactly
// once, by whichever of release, expiry, force-release, reclaim or shutdown
// removes the session from its shard first (removal happens under the
// shard lock; the unpin after it, outside any lock).
//
// Its leases are internal/lease's: each shard keeps a lease.Queue of its
// sessions by deadline, so ExpireBefore never scans all sessions and costs
// O(shards + k log n); the daemon's one lease.Sweep drives it.
type LockTable struct {
	pins        Pinner
	m           *metrics.Metrics
	log         zerolog.Logger
	clock       lease.Clock // sessions' stamps count from its epoch
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
	quarantined  quarantineSet // locks whose windows could not be invalidated
}

func newLockTable(opts Options) *LockTable {
	t := &LockTable{
		pins:        opts.Store,
		m:           opts.Metrics,
		log:         opts.Log,
		clock:       lease.NewClock(opts.Now),
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

// open creates a live session over blocks (already pinned by the caller,
// whose pins the table takes over on success). It applies the incarnation
// atomically with the insert, so a session of an old incarnation can never
// slip in after a reclaim.
func (t *LockTable) open(owner, inc string, blocks []*store.Block, bytes uint64) (*session, error) {
	return t.openQuery(owner, inc, grant{blocks: blocks, bytes: bytes})
}

// grant is what a query asks the table to hold: the pinned blocks and
// their bytes, the requester's query id (0: none), the unbind of their
// memory windows (nil: none) and the handoff the query named ("": none).
type grant struct {
	query   uint64
	blocks  []*store.Block
	bytes   uint64
	unbind  func() error
	handoff string
}

// openQuery is open for the query g.
func (t *LockTable) openQuery(owner, inc string, g grant) (*session, error) {
	blocks, bytes := g.blocks, g.bytes
	now := t.clock.Now()
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
	created := t.clock.Stamp(now)
	s := &session{
		who: n.incarnationLocked(inc), blocks: blocks, bytes: bytes, query: g.query,
		created: created, seq: t.openSeq.Add(1),
	}
	if g.unbind != nil || g.handoff != "" {
		s.extra = &sessionExtra{unbind: g.unbind, handoff: g.handoff}
	}
	deadline := created + lease.Stamp(min(t.timeout, t.maxLifetime))
	for {
		s.id = newID()
		sh := t.shardOf(s.id)
		sh.mu.Lock()
		_, dupTomb := sh.tomb[s.id]
		if sh.live.get(s.id) == nil && !dupTomb {
			sh.live.put(s)
			sh.expiry.Add(s, deadline)
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
	sh.expiry.Remove(s) // false when the sweep took it out (Expire)
	if t.tombPerShd > 0 {
		if old := sh.ring[sh.ringAt]; old != (sessionID{}) {
			delete(sh.tomb, old)
		}
		sh.ring[sh.ringAt] = s.id
		sh.ringAt = (sh.ringAt + 1) % t.tombPerShd
		sh.tomb[s.id] = tombstone{owner: s.owner(), end: why}
	}
}

// finish does what follows a removal, outside the shard lock: invalidate
// its memory windows, then unpin (the single unpin of this session), gauges, and the node's session set. The
// node state is the session's own: a node with live sessions is never
// forgotten (evictIdleNodesLocked). Windows that could not be invalidated
// quarantine the blocks instead of unpinning them (quarantine.go). It
// returns the blocks it unpinned.
func (t *LockTable) finish(s *session) (unpinned int) {
	quarantined := false
	if unbind := s.unbind(); unbind != nil {
		if err := unbind(); err != nil { // else no READ through its windows from here on
			t.quarantine(s.owner(), s.id.String(), s.blocks, s.bytes, err, true)
			quarantined = true
		}
	}
	if !quarantined {
		t.pins.Unpin(s.blocks)
		unpinned = len(s.blocks)
	}
	t.liveSessions.Add(-1)
	t.lockedBlocks.Add(-int64(len(s.blocks)))
	t.m.SessionsActive.Dec()
	t.m.LockActive.Sub(float64(len(s.blocks)))
	n := s.who.node
	n.gauge.Dec()
	n.mu.Lock()
	n.sessions.remove(s)
	if quarantined {
		n.pinned -= s.bytes // the node-wide pin count keeps them (quarantine)
	} else {
		t.unadmit(n, s)
	}
	n.mu.Unlock()
	return unpinned
}

// liveLocked returns id's session if its lease still runs at nowS. A
// session whose lease has lapsed is removed here as expired and returned
// in lapsed instead: the caller hands it to t.expired once sh.mu is
// unlocked (gone does both). sh.mu held.
func (t *LockTable) liveLocked(sh *shard, id sessionID, nowS lease.Stamp) (s, lapsed *session) {
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
	now := t.clock.Now()
	sh := t.shardOf(s.id)
	sh.mu.Lock()
	live, lapsed := t.liveLocked(sh, s.id, t.clock.Stamp(now))
	if live != s {
		t.gone(sh, s.id, lapsed, now)
		return false
	}
	t.removeLocked(sh, s, why)
	sh.mu.Unlock()
	t.finish(s)
	return true
}
