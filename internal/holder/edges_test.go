package holder

import (
	"fmt"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// TestDeadlineWithoutSweep: the lease ends at its deadline even when the
// sweeper has not ticked since: a late renewal fails (NotFound, expired)
// and a late release reports not live (EXPIRED), and either ends the
// session, unpins it and counts a lock timeout.
func TestDeadlineWithoutSweep(t *testing.T) {
	tests := []struct {
		name string
		late func(t *testing.T, c pegadv1.PeerServiceClient, sid string)
	}{
		{"renew", func(t *testing.T, c pegadv1.PeerServiceClient, sid string) {
			_, err := c.RenewTransferLock(ctxT(t), &pegadv1.RenewTransferLockRequest{SessionId: sid, Requester: req("r", "i")})
			wantCode(t, err, codes.NotFound, "expired")
		}},
		{"release", func(t *testing.T, c pegadv1.PeerServiceClient, sid string) {
			r, err := c.ReleaseTransferLock(ctxT(t), &pegadv1.ReleaseTransferLockRequest{SessionId: sid, Requester: req("r", "i")})
			if err != nil {
				t.Fatal(err)
			}
			if r.GetWasLive() || r.GetEnd() != pegadv1.SessionEnd_SESSION_END_EXPIRED {
				t.Fatalf("release after the deadline: was_live=%v end=%v, want false EXPIRED", r.GetWasLive(), r.GetEnd())
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(o *Options) { o.Log = zerolog.Nop() }, "a")
			c := e.client(t)
			q, err := c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
				Namespace: "ns", Hashes: [][]byte{[]byte("a")}, Requester: req("r", "i")})
			if err != nil || q.GetSessionId() == "" {
				t.Fatalf("query: %v %v", q, err)
			}
			e.clock.Advance(10*time.Second + time.Millisecond) // lock timeout 10s; no ExpireBefore
			tc.late(t, c, q.GetSessionId())
			st := e.state()
			if st.sessions != 0 || st.outstanding != 0 || st.timeouts != 1 || st.renewals != 0 {
				t.Fatalf("after a late %s: %+v, want the session ended as expired", tc.name, st)
			}
			// The tombstone says expired from now on.
			r, err := c.ReleaseTransferLock(ctxT(t), &pegadv1.ReleaseTransferLockRequest{SessionId: q.GetSessionId(), Requester: req("r", "i")})
			if err != nil || r.GetWasLive() || r.GetEnd() != pegadv1.SessionEnd_SESSION_END_EXPIRED {
				t.Fatalf("second release: %v %v", r, err)
			}
			if n := e.svc.locks.ExpireBefore(e.clock.Now()); n != 0 {
				t.Fatalf("sweeper expired %d sessions already ended", n)
			}
		})
	}
}

// TestQueryThatPinsNothingCreatesNoNode: queries that find nothing (from
// any number of node ids) leave the requester-node table empty; a query
// that pins creates its node; a known node's new incarnation still
// reclaims through a query that finds nothing.
func TestQueryThatPinsNothingCreatesNoNode(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.MaxRequesters = 16 }, "a")
	c := e.client(t)
	nodes := func() int {
		e.svc.locks.nodesMu.Lock()
		defer e.svc.locks.nodesMu.Unlock()
		return len(e.svc.locks.nodes)
	}
	for i := 0; i < 500; i++ {
		q, err := c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
			Namespace: "ns", Hashes: [][]byte{[]byte("missing")}, Requester: req(fmt.Sprintf("n%d", i), "i1")})
		if err != nil || q.GetSessionId() != "" {
			t.Fatalf("query %d: %v %v", i, q, err)
		}
	}
	if n := nodes(); n != 0 {
		t.Fatalf("%d requester nodes tracked after 500 queries that pinned nothing, want 0", n)
	}
	q, err := c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("a")}, Requester: req("pinner", "i1")})
	if err != nil || q.GetSessionId() == "" {
		t.Fatalf("query: %v %v", q, err)
	}
	if n := nodes(); n != 1 {
		t.Fatalf("%d nodes after a query that pinned, want 1", n)
	}
	if _, err := c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("missing")}, Requester: req("pinner", "i2")}); err != nil {
		t.Fatal(err)
	}
	if st := e.state(); st.reclaims != 1 || st.sessions != 0 || st.outstanding != 0 {
		t.Fatalf("new incarnation through an empty query did not reclaim: %+v", st)
	}
	_, err = c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("a")}, Requester: req("pinner", "i1")})
	wantCode(t, err, codes.FailedPrecondition, "stale")
}

// TestSessionsPage (issue 15 item 4): pages of sessions follow each
// other oldest first, each live session exactly once, while sessions end
// and open between pages; the last page has no next cursor.
func TestSessionsPage(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Log = zerolog.Nop() })
	var ids []string
	for i := 0; i < 300; i++ {
		ids = append(ids, e.open(t, fmt.Sprintf("n%d", i%5), "", 1))
		e.clock.Advance(time.Millisecond)
	}
	ended := map[string]bool{}
	seen := map[string]bool{}
	var cursor uint64
	var last time.Time
	pages := 0
	for {
		page, next := e.svc.locks.SessionsPage(cursor, 7)
		pages++
		for _, s := range page {
			if seen[s.ID] || ended[s.ID] || s.CreatedAt.Before(last) {
				t.Fatalf("page %d: %s (seen %v, ended %v) created %v after %v", pages, s.ID, seen[s.ID], ended[s.ID], s.CreatedAt, last)
			}
			seen[s.ID], last = true, s.CreatedAt
		}
		if next == 0 {
			break
		}
		if len(page) != 7 {
			t.Fatalf("page %d: %d rows with a next cursor", pages, len(page))
		}
		cursor = next
		// An older session not yet listed ends; a new one opens (listed
		// at the end, being the newest).
		for _, id := range ids {
			if !seen[id] && !ended[id] {
				if _, err := e.svc.locks.ForceRelease(id, "test"); err != nil {
					t.Fatal(err)
				}
				ended[id] = true
				break
			}
		}
		ids = append(ids, e.open(t, "late", "", 1))
	}
	if want := len(ids) - len(ended); len(seen) != want || e.svc.locks.Len() != want {
		t.Fatalf("listed %d sessions over %d pages, %d live", len(seen), pages, e.svc.locks.Len())
	}
	if page, next := e.svc.locks.SessionsPage(0, 1000); len(page) != len(seen) || next != 0 {
		t.Fatalf("one large page: %d rows, next %d", len(page), next)
	}
}
