package holder

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/metrics"
)

// TestLapsedLeaseOnEveryPath: a session past its deadline that the sweeper
// has not reached yet is over on every path, not only release and renew
// (TestDeadlineWithoutSweep): a force-release, a requester restart or an
// abandoned query ends it as expired (one lock timeout, no force-release
// or reclaim counted), and the listings leave it out.
func TestLapsedLeaseOnEveryPath(t *testing.T) {
	tests := []struct {
		name string
		// act runs on the lapsed session id; it checks its own answer.
		act  func(t *testing.T, e *env, id string)
		want func(st state) bool
	}{
		{"force-release", func(t *testing.T, e *env, id string) {
			n, err := e.svc.locks.ForceRelease(id, "op")
			if !errors.Is(err, ErrUnknownSession) || !strings.Contains(err.Error(), "expired") || n != 0 {
				t.Fatalf("force-release of a lapsed lease: %d, %v; want ErrUnknownSession (expired)", n, err)
			}
		}, func(st state) bool { return st.force == 0 }},
		{"requester restart", func(t *testing.T, e *env, id string) {
			n, err := e.svc.ObserveIncarnation("r", "i2")
			if err != nil || n != 0 {
				t.Fatalf("restart reclaimed %d sessions (%v); want 0, the lapsed one expired", n, err)
			}
		}, func(st state) bool { return st.reclaims == 0 }},
		{"end", func(t *testing.T, e *env, id string) {
			p, _ := parseID(id)
			s := e.svc.locks.shardOf(p).live.get(p)
			if e.svc.locks.end(s, EndReleased) {
				t.Fatal("end reported a lapsed session as ended for its reason")
			}
			if v := metrics.Value(e.m.SessionEnds.WithLabelValues(metrics.OutcomeReleased)); v != 0 {
				t.Fatalf("a lapsed session ended as released (%v)", v)
			}
		}, func(st state) bool { return true }},
		{"listings", func(t *testing.T, e *env, id string) {
			for _, s := range e.svc.locks.Sessions() {
				if s.ID == id {
					t.Fatal("Sessions lists the lapsed session")
				}
			}
			for _, s := range pageOf(e.svc.locks.SessionsPage(0, 10)) {
				if s.ID == id {
					t.Fatal("SessionsPage lists the lapsed session")
				}
			}
			// Listing does not end it; the sweeper still does, once.
			if n := e.svc.locks.ExpireBefore(e.clock.Now()); n != 1 {
				t.Fatalf("sweeper expired %d, want 1", n)
			}
		}, func(st state) bool { return true }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *Options) { o.Log = zerolog.Nop() })
			id := e.open(t, "r", "i1", 3)
			e.clock.Advance(5 * time.Second)
			keep := e.open(t, "other", "", 1) // deadline 5 s after id's
			e.clock.Advance(5 * time.Second)  // lock timeout 10 s: id lapses now; no sweep
			tc.act(t, e, id)
			st := e.state()
			if st.sessions != 1 || st.outstanding != 1 || st.timeouts != 1 || !tc.want(st) {
				t.Fatalf("after %s: %+v; want only the unlapsed session left and the lapsed one counted as a lock timeout", tc.name, st)
			}
			if s := e.svc.locks.Sessions(); len(s) != 1 || s[0].ID != keep {
				t.Fatalf("listing after %s: %+v, want only %s", tc.name, s, keep)
			}
			if r, err := e.svc.locks.Release(id, "r", ""); err != nil || r.WasLive || r.End != EndExpired {
				t.Fatalf("release after %s: %+v %v, want not live, expired", tc.name, r, err)
			}
			e.pins.check(t, 1)
		})
	}
}

// pageOf drops SessionsPage's cursor.
func pageOf(page []SessionInfo, _ uint64) []SessionInfo { return page }
