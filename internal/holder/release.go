package holder

// How a transfer lock ends: released by its requester, renewed until its
// maximum lifetime, expired by the lease sweeper (or by whichever call
// finds its lease lapsed first), force-released by an operator, or
// released with all others at shutdown. Each ends it exactly once: the
// session leaves its shard under the shard's lock, once, and only that
// caller unpins.

import (
	"fmt"
	"time"

	"github.com/pegaflow/pegad/internal/lease"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// ReleaseResult is what a release did.
type ReleaseResult struct {
	Released int       // blocks unpinned by this call
	WasLive  bool      // this call ended a live session
	End      EndReason // how the session ended (EndReleased when WasLive)
	Age      time.Duration
	// Handoff is the token the session's query named and Keys its blocks,
	// when this call released it live ("" and nil otherwise).
	Handoff string
	Keys    []store.Key
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
	now := t.clock.Now()
	sh := t.shardOf(id)
	sh.mu.Lock()
	s, lapsed := t.liveLocked(sh, id, t.clock.Stamp(now))
	if s != nil {
		if s.owner() != owner {
			sh.mu.Unlock()
			return ReleaseResult{}, fmt.Errorf("%w: session %s", ErrNotOwner, id)
		}
		t.removeLocked(sh, s, EndReleased)
		sh.mu.Unlock()
		r := ReleaseResult{WasLive: true, End: EndReleased, Age: now.Sub(t.clock.At(s.created))}
		if r.Handoff = s.handoff(); r.Handoff != "" {
			r.Keys = make([]store.Key, len(s.blocks))
			for i, b := range s.blocks { // keys before the unpin: a block may be freed by it
				r.Keys[i] = b.Key()
			}
		}
		r.Released = t.finish(s)
		return r, nil
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
		r.Age = now.Sub(t.clock.At(lapsed.created))
	}
	return r, nil
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
	now := t.clock.Now()
	nowS := t.clock.Stamp(now)
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
	limit := s.created + lease.Stamp(t.maxLifetime)
	if nowS >= limit || s.deadline() >= limit {
		return time.Time{}, 0, fmt.Errorf("%w: session %s created %s ago, maximum %s; live until %s",
			ErrLifetimeExhausted, id, time.Duration(nowS-s.created).Round(time.Millisecond), t.maxLifetime,
			t.clock.At(s.deadline()).UTC().Format(time.RFC3339Nano))
	}
	sh.expiry.Renew(s, min(nowS+lease.Stamp(t.timeout), limit)) // never shortens it
	t.m.LockRenewals.Inc()
	return t.clock.At(s.deadline()), time.Duration(limit - nowS), nil
}

// ExpireBefore ends every session whose deadline is not after now and
// returns how many. It locks each shard briefly and pops only expired
// entries: O(shards + k log n) for k expired of n live.
func (t *LockTable) ExpireBefore(now time.Time) int {
	var expired []*session
	nowS := t.clock.Stamp(now)
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for sh.expiry.Due(nowS) {
			s, _ := sh.expiry.PopLapsed(nowS)
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
		Int("blocks", len(s.blocks)).Uint64("bytes", s.bytes).Dur("age", now.Sub(t.clock.At(s.created))).
		Int32("renewals", s.lease.Renewals()).Msg("Transfer lock expired")
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
	now := t.clock.Now()
	sh := t.shardOf(id)
	sh.mu.Lock()
	s, lapsed := t.liveLocked(sh, id, t.clock.Stamp(now))
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
	released = t.finish(s)
	t.m.LockForceReleases.Inc()
	t.log.Warn().Stringer("session", id).Str("operator", operator).Str("requester", s.owner()).
		Int("blocks", len(s.blocks)).Dur("age", now.Sub(t.clock.At(s.created))).Msg("Transfer lock force-released")
	return released, nil
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
