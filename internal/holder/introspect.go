package holder

import (
	"time"

	"github.com/pegaflow/pegad/internal/lease"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// What the lock table shows operators beyond its own bookkeeping: the
// outcome label of ended sessions, the oldest live session's age (a
// leaked lock grows it) and each session's locked blocks.

// outcome is r as the outcome label of metrics.SessionEnds.
func (r EndReason) outcome() string {
	switch r {
	case EndReleased:
		return metrics.OutcomeReleased
	case EndExpired:
		return metrics.OutcomeExpired
	case EndReclaimed:
		return metrics.OutcomeReclaimed
	case EndAbandoned:
		return metrics.OutcomeAbandoned
	}
	return metrics.OutcomeForced // force-release and shutdown: the holder ended it
}

// oldestAge is the age of the oldest live session (0 when none), read at
// each metrics scrape: one pass over the shards, each locked briefly. A
// session whose lease has lapsed but that the sweeper has not reached yet is
// not live (session.lapsed), so it does not count.
func (t *LockTable) oldestAge() time.Duration {
	now := t.clock.Now()
	nowS := t.clock.Stamp(now)
	var oldest lease.Stamp
	found := false
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		sh.live.each(func(s *session) {
			if s.lapsed(nowS) {
				return
			}
			if !found || s.created < oldest {
				oldest, found = s.created, true
			}
		})
		sh.mu.Unlock()
	}
	if !found {
		return 0
	}
	return now.Sub(t.clock.At(oldest))
}

// LockedBlock is one block a session pins (pegactl locks list).
type LockedBlock struct {
	Key   store.Key
	Bytes uint64
}

// Locked lists the session's blocks, in the order the requester asked.
func (s SessionInfo) Locked() []LockedBlock {
	out := make([]LockedBlock, len(s.blocks))
	for i, b := range s.blocks {
		out[i] = LockedBlock{Key: b.Key(), Bytes: b.Size()}
	}
	return out
}
