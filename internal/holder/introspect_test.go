package holder

import (
	"testing"
	"time"
)

// The oldest-session-age gauge must count only live sessions: one whose
// lease has lapsed pins nothing a requester can use, so before the sweeper
// gets to it the gauge must not rise with it (a false leaked-lock alert).
func TestOldestAgeSkipsLapsedSessions(t *testing.T) {
	e := newEnv(t, nil, "a", "b")
	if got := e.svc.locks.oldestAge(); got != 0 {
		t.Fatalf("no sessions: oldestAge = %v, want 0", got)
	}
	e.open(t, "req", "r1", 1)
	e.clock.Advance(4 * time.Second)
	if got := e.svc.locks.oldestAge(); got != 4*time.Second {
		t.Fatalf("one live session 4s old: oldestAge = %v", got)
	}
	e.open(t, "req", "r1", 1) // younger; the first lapses at 10s, this one at 14s
	e.clock.Advance(7 * time.Second)
	if got := e.svc.locks.oldestAge(); got != 7*time.Second {
		t.Fatalf("first session lapsed, not swept: oldestAge = %v, want the live one's 7s", got)
	}
	e.clock.Advance(10 * time.Second)
	if got := e.svc.locks.oldestAge(); got != 0 {
		t.Fatalf("every session lapsed, none swept: oldestAge = %v, want 0", got)
	}
}
