package holder

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/metrics"
)

// TestLimitsOpen: each limit refuses the session that would pass it,
// names itself, is counted, leaves the table unchanged, and frees up when
// sessions end; other peers are not affected by one peer's caps.
func TestLimitsOpen(t *testing.T) {
	type step struct {
		owner, inc string
		blocks     int    // 100 bytes each
		want       string // limit name refused, "" for OK
	}
	for _, c := range []struct {
		name   string
		limits Limits
		steps  []step
	}{
		{"sessions per peer", Limits{SessionsPerPeer: 2}, []step{
			{"a", "", 1, ""}, {"a", "", 1, ""}, {"a", "", 1, metrics.LimitSessionsPerPeer}, {"b", "", 1, ""},
		}},
		{"bytes per peer", Limits{PinnedBytesPerPeer: 800}, []step{
			{"a", "", 5, ""}, {"a", "", 4, metrics.LimitPinnedBytesPerPeer}, {"a", "", 3, ""},
			{"a", "", 1, metrics.LimitPinnedBytesPerPeer}, {"b", "", 8, ""},
		}},
		{"bytes of the node", Limits{PinnedBytes: 1000}, []step{
			{"a", "", 6, ""}, {"b", "", 5, metrics.LimitPinnedBytesNode}, {"b", "", 4, ""}, {"c", "", 1, metrics.LimitPinnedBytesNode},
		}},
		{"a restart's old sessions do not count", Limits{SessionsPerPeer: 1, PinnedBytesPerPeer: 500}, []step{
			{"a", "i1", 5, ""}, {"a", "i1", 1, metrics.LimitSessionsPerPeer}, {"a", "i2", 5, ""},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, func(o *Options) { o.Limits = c.limits })
			lt := e.svc.locks
			for i, s := range c.steps {
				before := e.state()
				pinnedBefore := lt.PinnedBytes()
				refusedBefore := metrics.Value(e.m.PeerLimitRefused.WithLabelValues(s.want))
				blocks := e.pins.pins(s.blocks)
				_, err := lt.open(s.owner, s.inc, blocks, uint64(s.blocks)*100)
				if s.want == "" {
					if err != nil {
						t.Fatalf("step %d %+v: %v", i, s, err)
					}
					continue
				}
				e.pins.Unpin(blocks) // the caller keeps its pins on error
				if !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), s.want) {
					t.Fatalf("step %d %+v: %v, want ErrLimit naming %s", i, s, err, s.want)
				}
				if st := e.state(); st.sessions != before.sessions || st.locked != before.locked || lt.PinnedBytes() != pinnedBefore {
					t.Fatalf("step %d: a refusal changed state: %+v -> %+v", i, before, st)
				}
				if got := metrics.Value(e.m.PeerLimitRefused.WithLabelValues(s.want)); got != refusedBefore+1 {
					t.Fatalf("step %d: refusals of %s = %v, want %v", i, s.want, got, refusedBefore+1)
				}
			}
			if got := metrics.Value(e.m.PeerPinnedBytes); got != float64(lt.PinnedBytes()) {
				t.Fatalf("pinned bytes gauge %v, table %d", got, lt.PinnedBytes())
			}
			lt.ReleaseAll("test")
			if lt.PinnedBytes() != 0 || metrics.Value(e.m.PeerPinnedBytes) != 0 {
				t.Fatalf("after ending every session: %d bytes pinned, gauge %v", lt.PinnedBytes(), metrics.Value(e.m.PeerPinnedBytes))
			}
			// Everything was given back: the first step fits again.
			s := c.steps[0]
			if _, err := lt.open(s.owner, "", e.pins.pins(s.blocks), uint64(s.blocks)*100); err != nil {
				t.Fatalf("after release: %v", err)
			}
			lt.ReleaseAll("test")
			e.pins.check(t, 0)
		})
	}
}

// TestLimitsRPC: over the wire a query past a cap is ResourceExhausted
// naming the cap and pins nothing; renewals of admitted sessions keep
// working at the cap and do not grow what is counted.
func TestLimitsRPC(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Limits = Limits{SessionsPerPeer: 1} }, "x", "y")
	c := e.client(t)
	ctx := ctxT(t)
	q := func(node string) (*pegadv1.QueryBlocksForTransferResponse, error) {
		return c.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
			Namespace: "ns", Hashes: [][]byte{[]byte("x")}, Requester: req(node, "i1")})
	}
	r, err := q("flood")
	if err != nil {
		t.Fatal(err)
	}
	_, err = q("flood")
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), metrics.LimitSessionsPerPeer) {
		t.Fatalf("second session: %v, want ResourceExhausted naming %s", err, metrics.LimitSessionsPerPeer)
	}
	for range 3 {
		if _, err := c.RenewTransferLock(ctx, &pegadv1.RenewTransferLockRequest{SessionId: r.SessionId, Requester: req("flood", "i1")}); err != nil {
			t.Fatalf("renewal at the cap: %v", err)
		}
	}
	if e.svc.locks.Len() != 1 {
		t.Fatalf("%d sessions, want 1", e.svc.locks.Len())
	}
	if _, err := q("other"); err != nil {
		t.Fatalf("another peer: %v", err)
	}
	e.svc.locks.ReleaseAll("test")
	e.pins.check(t, 0)
}

// authFromMetadata plays the TLS layer: the test names the caller's
// certificate names in metadata ("names", first is the identity).
func authFromMetadata(ctx context.Context) (string, []string, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	names := md.Get("names")
	if len(names) == 0 {
		return "", nil, false
	}
	return names[0], names, true
}

// TestAuthenticatedOwner: with an authenticator, sessions belong to the
// certificate identity, a claim the certificate does not prove is refused
// before anything is pinned, and a peer cannot release or renew another's
// session by claiming its node id.
func TestAuthenticatedOwner(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Authenticate = authFromMetadata }, "x")
	c := e.client(t)
	as := func(names ...string) context.Context {
		ctx := ctxT(t)
		for _, n := range names {
			ctx = metadata.AppendToOutgoingContext(ctx, "names", n)
		}
		return ctx
	}
	query := func(ctx context.Context, node string) (*pegadv1.QueryBlocksForTransferResponse, error) {
		return c.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
			Namespace: "ns", Hashes: [][]byte{[]byte("x")}, Requester: req(node, "i1")})
	}
	a := as("spiffe://c/a", "node-a")
	r, err := query(a, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if got := e.svc.locks.Sessions(); len(got) != 1 || got[0].RequesterID != "spiffe://c/a" {
		t.Fatalf("sessions %+v, want one owned by spiffe://c/a", got)
	}

	pinCalls := e.state().pinCalls
	for _, cl := range []struct {
		name string
		ctx  context.Context
		node string
		code codes.Code
	}{
		{"claims another node", as("node-b"), "node-a", codes.PermissionDenied},
		{"no certificate", ctxT(t), "node-a", codes.Unauthenticated},
	} {
		if _, err := query(cl.ctx, cl.node); status.Code(err) != cl.code {
			t.Errorf("%s: query %v, want %v", cl.name, err, cl.code)
		}
		_, err := c.ReleaseTransferLock(cl.ctx, &pegadv1.ReleaseTransferLockRequest{SessionId: r.SessionId, Requester: req(cl.node, "i1")})
		if status.Code(err) != cl.code {
			t.Errorf("%s: release %v, want %v", cl.name, err, cl.code)
		}
		_, err = c.RenewTransferLock(cl.ctx, &pegadv1.RenewTransferLockRequest{SessionId: r.SessionId, Requester: req(cl.node, "i1")})
		if status.Code(err) != cl.code {
			t.Errorf("%s: renew %v, want %v", cl.name, err, cl.code)
		}
		_, err = c.RdmaHandshake(cl.ctx, &pegadv1.RdmaHandshakeRequest{Requester: req(cl.node, "i1")})
		if status.Code(err) != cl.code && status.Code(err) != codes.Unavailable {
			t.Errorf("%s: handshake %v, want %v", cl.name, err, cl.code)
		}
	}
	if e.state().pinCalls != pinCalls || e.svc.locks.Len() != 1 {
		t.Fatal("a refused claim pinned or ended something")
	}
	if v := metrics.Value(e.m.PeerAuthRefused.WithLabelValues(metrics.AuthIdentityClaimed)); v != 4 {
		t.Errorf("identity_mismatch refusals %v, want 4", v)
	}
	// Node b proving its own name is not the owner either.
	_, err = c.ReleaseTransferLock(as("node-b"), &pegadv1.ReleaseTransferLockRequest{SessionId: r.SessionId, Requester: req("node-b", "i1")})
	if status.Code(err) != codes.PermissionDenied {
		t.Errorf("release by another identity: %v, want PermissionDenied", err)
	}
	// The owner may use any name its certificate proves.
	rel, err := c.ReleaseTransferLock(a, &pegadv1.ReleaseTransferLockRequest{SessionId: r.SessionId, Requester: req("spiffe://c/a", "i1")})
	if err != nil || !rel.WasLive {
		t.Fatalf("release by the owner: %v %+v", err, rel)
	}
	e.pins.check(t, 0)
}

// TestRefusedNewIncarnationStillReclaims: a query of a restarted requester
// that a limit refuses has still made its incarnation current, so the old
// incarnation's sessions are reclaimed now: no later call would see them
// as another incarnation's, and they would pin until their deadline
// (review finding).
func TestRefusedNewIncarnationStillReclaims(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Limits = Limits{PinnedBytesPerPeer: 600} })
	lt := e.svc.locks
	if _, err := lt.open("a", "i1", e.pins.pins(5), 500); err != nil {
		t.Fatal(err)
	}
	blocks := e.pins.pins(7)
	if _, err := lt.open("a", "i2", blocks, 700); !errors.Is(err, ErrLimit) {
		t.Fatalf("query over the cap: %v, want ErrLimit", err)
	}
	e.pins.Unpin(blocks)
	if st := e.state(); st.sessions != 0 || st.locked != 0 || lt.PinnedBytes() != 0 {
		t.Fatalf("after the refused query of the new incarnation: %+v, pinned %d; want the old session reclaimed", st, lt.PinnedBytes())
	}
}

// TestHandshakeAuthenticated: on an authenticated peer port RdmaHandshake
// checks who asks before anything else — whether or not rdma is
// configured — and hands the acceptor only a proven caller, whose
// incarnation is then recorded under its certificate identity.
func TestHandshakeAuthenticated(t *testing.T) {
	as := func(t *testing.T, names ...string) context.Context {
		ctx := ctxT(t)
		for _, n := range names {
			ctx = metadata.AppendToOutgoingContext(ctx, "names", n)
		}
		return ctx
	}
	tests := []struct {
		name string
		ctx  func(t *testing.T) context.Context
		node string
		code codes.Code // with an acceptor; without one, OK becomes Unavailable
	}{
		{"no certificate", func(t *testing.T) context.Context { return ctxT(t) }, "node-a", codes.Unauthenticated},
		{"claims another node", func(t *testing.T) context.Context { return as(t, "node-b") }, "node-a", codes.PermissionDenied},
		{"no node id", func(t *testing.T) context.Context { return as(t, "node-a") }, "", codes.InvalidArgument},
		{"node id too long", func(t *testing.T) context.Context { return as(t, "node-a") }, strings.Repeat("n", MaxNodeIDLen+1), codes.InvalidArgument},
		{"proven", func(t *testing.T) context.Context { return as(t, "spiffe://c/a", "node-a") }, "node-a", codes.OK},
	}
	for _, withAcceptor := range []bool{true, false} {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("%s/acceptor=%v", tc.name, withAcceptor), func(t *testing.T) {
				acc := &fakeAcceptor{}
				e := newEnv(t, func(o *Options) {
					o.Authenticate = authFromMetadata
					if withAcceptor {
						o.Acceptor = acc
					}
				})
				_, err := e.client(t).RdmaHandshake(tc.ctx(t), &pegadv1.RdmaHandshakeRequest{Requester: req(tc.node, "i1")})
				want := tc.code
				if want == codes.OK && !withAcceptor {
					want = codes.Unavailable
				}
				if status.Code(err) != want {
					t.Fatalf("handshake: %v, want %v", err, want)
				}
				if wantCalls := map[bool]int{true: 1}[want == codes.OK]; acc.calls != wantCalls {
					t.Fatalf("acceptor called %d times, want %d", acc.calls, wantCalls)
				}
				e.svc.locks.nodesMu.Lock()
				_, byIdentity := e.svc.locks.nodes["spiffe://c/a"]
				nodes := len(e.svc.locks.nodes)
				e.svc.locks.nodesMu.Unlock()
				if want == codes.OK && (!byIdentity || nodes != 1) || want != codes.OK && nodes != 0 {
					t.Fatalf("requester nodes after the handshake: %d (identity recorded %v)", nodes, byIdentity)
				}
			})
		}
	}
}
