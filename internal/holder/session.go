package holder

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"

	"github.com/pegaflow/pegad/internal/lease"
	"github.com/pegaflow/pegad/internal/store"
)

// How one live session is laid out in memory. A holder may keep a million
// of them (issue 11.5: at most 200 B each plus 16 B per locked block), so
// a session is one 112-byte record with no pointers to per-session strings:
// its id is the raw 16 bytes (hex only when shown), its owner and
// incarnation are one pointer to a record interned per requester node
// (incarnation), and its times are lease.Stamps of the table's clock.

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

// session is one transfer lock. id, who, blocks, bytes, created, seq and extra are
// immutable; prev and next are guarded by its node's mu; the rest by its
// shard's mu. Its lease (deadline, renewals, expiry order) is a lease.Item
// in its shard's lease.Queue.
type session struct {
	id      sessionID
	who     *incarnation
	blocks  []*store.Block
	bytes   uint64
	created lease.Stamp
	seq     uint64 // opening order, for paged listings

	// lease is the session's deadline, its place in its shard's expiry
	// queue and its renewal count (internal/lease's one implementation).
	lease lease.Item
	// query is the requester's id of the query that opened it (0: none),
	// so that a requester that lost the answer can still release it.
	query uint64
	// extra holds what only some sessions have (memory windows, a
	// handoff); nil for the rest, so a session stays one small record.
	extra *sessionExtra

	prev, next *session // in who.node.sessions; guarded by that node's mu
}

func (s *session) owner() string       { return s.who.node.id }
func (s *session) incarnation() string { return s.who.inc }

// LeaseItem is the session's lease (lease.Leased).
func (s *session) LeaseItem() *lease.Item { return &s.lease }

// lapsed is the one rule of when a session is over: when its lease has
// lapsed at nowS, whether or not the sweeper has ticked since. Every path
// that finds a session (release, renew, force-release, end, listings, the
// oldest-age gauge, the sweeper) asks this, so none treats a lapsed lease
// as live.
func (s *session) lapsed(nowS lease.Stamp) bool { return s.lease.Lapsed(nowS) }

func (s *session) deadline() lease.Stamp { return s.lease.Deadline() }

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

// sessionExtra is the rarer part of a session. Immutable.
type sessionExtra struct {
	// unbind invalidates the session's memory windows (Options.Windows;
	// nil: none); finish calls it before the unpin, which an error of it
	// turns into a quarantine.
	unbind func() error
	// handoff is the token of the producer's handoff its query named (a
	// P/D pull; "": none): a release after a complete read ends the
	// handoff's pin of these blocks (Options.Handoffs).
	handoff string
}

func (s *session) unbind() func() error {
	if s.extra == nil {
		return nil
	}
	return s.extra.unbind
}

func (s *session) handoff() string {
	if s.extra == nil {
		return ""
	}
	return s.extra.handoff
}

type tombstone struct {
	owner string
	end   EndReason
}
