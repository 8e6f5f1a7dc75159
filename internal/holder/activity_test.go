package holder

import (
	"math"
	"testing"
	"time"
)

// TestRequesterActivity: what the holder's connection reaper sees of a
// requester: its live sessions, and how long since it last asked for one.
func TestRequesterActivity(t *testing.T) {
	e := newEnv(t, nil)
	check := func(node string, wantLive int, wantIdle time.Duration) {
		t.Helper()
		live, idle := e.svc.locks.RequesterActivity(node)
		if live != wantLive || idle != wantIdle {
			t.Errorf("RequesterActivity(%s) = %d, %v; want %d, %v", node, live, idle, wantLive, wantIdle)
		}
	}
	check("never-seen", 0, math.MaxInt64)
	id := e.open(t, "req", "i1", 2)
	e.clock.Advance(3 * time.Second)
	check("req", 1, 3*time.Second)
	if _, err := e.svc.locks.Release(id, "req", "i1"); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(2 * time.Second)
	check("req", 0, 5*time.Second)
	e.open(t, "req", "i1", 1)
	check("req", 1, 0)
}
