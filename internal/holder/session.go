package holder

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"math"
	"time"

	"github.com/pegaflow/pegad/internal/store"
)

// How one live session is laid out in memory. A holder may keep a million
// of them (issue 11.5: at most 200 B each plus 16 B per locked block), so
// a session is one 112-byte record with no pointers to per-session strings:
// its id is the raw 16 bytes (hex only when shown), its owner and
// incarnation are one pointer to a record interned per requester node
// (incarnation), and its times are nanoseconds since the table's epoch.

// sessionID is a session id's 16 random bytes; the wire form is 32 hex
// characters (String, parseID). The zero id is never given out: it marks
// an empty tombstone ring slot.
type sessionID [16]byte

func (id sessionID) String() string { return hex.EncodeToString(id[:]) }

// parseID reads a wire session id (32 hex characters, either case).
func parseID(s string) (sessionID, error) {
	var id sessionID
	if len(s) != idLen {
		return id, fmt.Errorf("%w: want %d hex characters, got %d characters", ErrInvalidSessionID, idLen, len(s))
	}
	for i := range len(s) {
		v, ok := hexVal(s[i])
		if !ok {
			return sessionID{}, fmt.Errorf("%w: character %d is not hex", ErrInvalidSessionID, i)
		}
		id[i/2] |= v << (4 * (1 - i%2))
	}
	return id, nil
}

func hexVal(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// ParseSessionID normalizes id (lower-case hex) and checks its shape.
func ParseSessionID(id string) (string, error) {
	p, err := parseID(id)
	if err != nil {
		return "", err
	}
	return p.String(), nil
}

func newID() sessionID {
	for {
		var id sessionID
		if _, err := rand.Read(id[:]); err != nil {
			// crypto/rand.Read never fails on supported platforms (Go >= 1.24).
			panic(fmt.Sprintf("holder: crypto/rand: %v", err))
		}
		if id != (sessionID{}) {
			return id
		}
	}
}

// incarnation is what a session records of who took it: the requester
// node's state and the incarnation it claimed ("" for none). Interned per
// node (nodeState.incarnationLocked), so a million sessions of a few
// hundred requesters share a few hundred of these. Immutable.
type incarnation struct {
	node *nodeState
	inc  string
}

// session is one transfer lock. id, who, blocks, bytes, created and seq are
// immutable; prev and next are guarded by its node's mu; the rest by its
// shard's mu.
type session struct {
	id      sessionID
	who     *incarnation
	blocks  []*store.Block
	bytes   uint64
	created stamp
	seq     uint64 // opening order, for paged listings

	deadline stamp
	heapIdx  int32 // index in shard.expiry; -1 once removed
	renewals int32 // saturates at MaxInt32
	// query is the requester's id of the query that opened it (0: none),
	// so that a requester that lost the answer can still release it.
	query uint64

	prev, next *session // in who.node.sessions; guarded by that node's mu
}

func (s *session) owner() string       { return s.who.node.id }
func (s *session) incarnation() string { return s.who.inc }

func (s *session) renewed() {
	if s.renewals < math.MaxInt32 {
		s.renewals++
	}
}

// stamp is a time as nanoseconds since the lock table's epoch (its clock's
// reading when it was made): 8 bytes instead of time.Time's 24, and, with
// the real clock, taken from the monotonic reading, so wall-clock steps do
// not move deadlines.
type stamp int64

func (t *LockTable) stamp(tm time.Time) stamp { return stamp(tm.Sub(t.epoch)) }
func (t *LockTable) at(s stamp) time.Time     { return t.epoch.Add(time.Duration(s)) }

// sessionList is a node's live sessions, linked through the sessions
// themselves (16 bytes in each record instead of an entry in a per-node
// set). Guarded by the node's mu.
type sessionList struct {
	head *session
	n    int
}

func (l *sessionList) len() int { return l.n }

func (l *sessionList) push(s *session) {
	s.prev, s.next = nil, l.head
	if l.head != nil {
		l.head.prev = s
	}
	l.head = s
	l.n++
}

// remove unlinks s, which must be in l.
func (l *sessionList) remove(s *session) {
	if s.prev != nil {
		s.prev.next = s.next
	} else {
		l.head = s.next
	}
	if s.next != nil {
		s.next.prev = s.prev
	}
	s.prev, s.next = nil, nil
	l.n--
}

type tombstone struct {
	owner string
	end   EndReason
}

// expiryHeap is a min-heap of live sessions by deadline. Sessions carry
// their index so release and renew remove/fix in O(log n), no lazy garbage.
type expiryHeap []*session

func (h expiryHeap) Len() int           { return len(h) }
func (h expiryHeap) Less(i, j int) bool { return h[i].deadline < h[j].deadline }
func (h expiryHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx = int32(i)
	h[j].heapIdx = int32(j)
}
func (h *expiryHeap) Push(x any) {
	s := x.(*session)
	s.heapIdx = int32(len(*h))
	*h = append(*h, s)
}
func (h *expiryHeap) Pop() any {
	old := *h
	n := len(old)
	s := old[n-1]
	old[n-1] = nil
	s.heapIdx = -1
	*h = old[:n-1]
	return s
}
