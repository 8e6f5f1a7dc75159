package holder

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/metrics"
)

func wantCode(t *testing.T, err error, want codes.Code, msgHas string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != want {
		t.Fatalf("code = %v (%q), want %v", st.Code(), st.Message(), want)
	}
	if msgHas != "" && !strings.Contains(st.Message(), msgHas) {
		t.Fatalf("message %q does not mention %q", st.Message(), msgHas)
	}
}

func hashes(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = []byte{byte(i >> 8), byte(i), 'h'}
	}
	return out
}

func TestQueryBadInput(t *testing.T) {
	tests := []struct {
		name string
		req  *pegadv1.QueryBlocksForTransferRequest
		code codes.Code
		msg  string
	}{
		{"empty namespace", &pegadv1.QueryBlocksForTransferRequest{Hashes: [][]byte{[]byte("a")}, Requester: req("n", "i")}, codes.InvalidArgument, "namespace"},
		{"namespace too long", &pegadv1.QueryBlocksForTransferRequest{Namespace: strings.Repeat("n", 257), Hashes: [][]byte{[]byte("a")}, Requester: req("n", "i")}, codes.InvalidArgument, "namespace"},
		{"no hashes", &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Requester: req("n", "i")}, codes.InvalidArgument, "no hashes"},
		{"too many hashes", &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: hashes(9), Requester: req("n", "i")}, codes.InvalidArgument, "at most 8"},
		{"empty hash", &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{[]byte("a"), {}}, Requester: req("n", "i")}, codes.InvalidArgument, "hash 1"},
		{"hash too long", &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{bytes.Repeat([]byte{1}, 65)}, Requester: req("n", "i")}, codes.InvalidArgument, "65 bytes"},
		{"duplicate hash", &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{[]byte("a"), []byte("b"), []byte("a")}, Requester: req("n", "i")}, codes.InvalidArgument, "repeats"},
		{"no requester", &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{[]byte("a")}}, codes.InvalidArgument, "node_id"},
		{"requester without node id", &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{[]byte("a")}, Requester: req("", "i")}, codes.InvalidArgument, "node_id"},
		{"node id too long", &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{[]byte("a")}, RequesterId: strings.Repeat("x", 300)}, codes.InvalidArgument, "node_id"},
		{"incarnation too long", &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{[]byte("a")}, Requester: req("n", strings.Repeat("i", 200))}, codes.InvalidArgument, "incarnation"},
		{"stale incarnation", &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{[]byte("a")}, Requester: req("old-node", "inc-1")}, codes.FailedPrecondition, "stale"},
	}
	e := newEnv(t, func(o *Options) { o.MaxHashes = 8 }, "a", "b")
	c := e.client(t)
	// A live session of an unrelated node, and a node that moved on from inc-1.
	e.open(t, "other", "x", 2)
	if _, err := e.svc.ObserveIncarnation("old-node", "inc-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.ObserveIncarnation("old-node", "inc-2"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := e.state()
			calls := e.rpcCount(metrics.RPCQueryBlocks, tc.code.String())
			_, err := c.QueryBlocksForTransfer(ctxT(t), tc.req)
			wantCode(t, err, tc.code, tc.msg)
			if after := e.state(); after != before {
				t.Fatalf("state changed:\n before %+v\n after  %+v", before, after)
			}
			if got := e.rpcCount(metrics.RPCQueryBlocks, tc.code.String()); got != calls+1 {
				t.Fatalf("holder_rpc_total{%s} = %v, want %v", tc.code, got, calls+1)
			}
		})
	}
	e.pins.check(t, 2)
}

func TestQueryNothingFoundLocksNothing(t *testing.T) {
	e := newEnv(t, nil, "present-elsewhere")
	c := e.client(t)
	hs := [][]byte{[]byte("x"), []byte("y")}
	resp, err := c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: hs, RequesterId: "legacy-node",
	})
	if err != nil {
		t.Fatal(err)
	}
	if resp.SessionId != "" || len(resp.Blocks) != 0 {
		t.Fatalf("nothing found but got session %q, %d blocks", resp.SessionId, len(resp.Blocks))
	}
	if len(resp.Missing) != 2 || string(resp.Missing[0]) != "x" || string(resp.Missing[1]) != "y" {
		t.Fatalf("missing = %q, want [x y]", resp.Missing)
	}
	if e.svc.Locks().Len() != 0 {
		t.Fatalf("sessions = %d, want 0", e.svc.Locks().Len())
	}
	e.pins.check(t, 0)
	if got := e.rpcCount(metrics.RPCQueryBlocks, "OK"); got != 1 {
		t.Fatalf("holder_rpc_total{OK} = %v", got)
	}
}

func TestQueryStorePanicIsInternalAndLeavesNothing(t *testing.T) {
	e := newEnv(t, nil, "a")
	e.pins.panicOnPin = true
	c := e.client(t)
	_, err := c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("a")}, Requester: req("n", "i"),
	})
	wantCode(t, err, codes.Internal, "")
	if got := e.rpcCount(metrics.RPCQueryBlocks, "Internal"); got != 1 {
		t.Fatalf("holder_rpc_total{Internal} = %v", got)
	}
	if e.svc.Locks().Len() != 0 {
		t.Fatal("a session survived a panicking query")
	}
	if len(e.logs.entries(t, "Holder RPC panicked")) != 1 {
		t.Fatal("panic not logged")
	}
}

func TestReleaseAndRenewBadInput(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client(t)
	e.open(t, "owner", "inc-1", 3)
	if _, err := e.svc.ObserveIncarnation("owner", "inc-2"); err != nil { // reclaims that session
		t.Fatal(err)
	}
	id := e.open(t, "owner", "inc-2", 3)
	unknown := strings.Repeat("ab", 16)
	tests := []struct {
		name  string
		id    string
		who   *pegadv1.Requester
		code  codes.Code
		msg   string
		renew bool // also applies to renew
	}{
		{"empty id", "", req("owner", ""), codes.InvalidArgument, "32 hex", true},
		{"short id", "abc", req("owner", ""), codes.InvalidArgument, "32 hex", true},
		{"non-hex id", strings.Repeat("zz", 16), req("owner", ""), codes.InvalidArgument, "not hex", true},
		{"33 chars", id + "0", req("owner", ""), codes.InvalidArgument, "32 hex", true},
		{"no requester", id, nil, codes.InvalidArgument, "node_id", true},
		{"unknown session", unknown, req("owner", ""), codes.NotFound, "unknown", true},
		{"other requester", id, req("thief", ""), codes.PermissionDenied, "another requester", true},
		{"stale incarnation", id, req("owner", "inc-1"), codes.FailedPrecondition, "stale", true},
	}
	for _, tc := range tests {
		for _, rpc := range []string{metrics.RPCReleaseLock, metrics.RPCRenewLock} {
			t.Run(tc.name+"/"+rpc, func(t *testing.T) {
				before := e.state()
				calls := e.rpcCount(rpc, tc.code.String())
				var err error
				if rpc == metrics.RPCReleaseLock {
					_, err = c.ReleaseTransferLock(ctxT(t), &pegadv1.ReleaseTransferLockRequest{SessionId: tc.id, Requester: tc.who})
				} else {
					_, err = c.RenewTransferLock(ctxT(t), &pegadv1.RenewTransferLockRequest{SessionId: tc.id, Requester: tc.who})
				}
				wantCode(t, err, tc.code, tc.msg)
				if after := e.state(); after != before {
					t.Fatalf("state changed:\n before %+v\n after  %+v", before, after)
				}
				if got := e.rpcCount(rpc, tc.code.String()); got != calls+1 {
					t.Fatalf("holder_rpc_total{%s,%s} = %v, want %v", rpc, tc.code, got, calls+1)
				}
			})
		}
	}
	if e.svc.Locks().Len() != 1 {
		t.Fatal("live session lost")
	}
	e.pins.check(t, 3)
}

// TestReleaseIdempotent: the answer to a release for each way a session
// can end, and for a retry.
func TestReleaseIdempotent(t *testing.T) {
	tests := []struct {
		name    string
		end     func(e *env, id string) // ends the session before the release; nil: live
		wantEnd pegadv1.SessionEnd
		notLive float64
	}{
		{"live", nil, pegadv1.SessionEnd_SESSION_END_RELEASED, 0},
		{"retry after release", func(e *env, id string) {
			if _, err := e.svc.locks.Release(id, "owner", ""); err != nil {
				panic(err)
			}
		}, pegadv1.SessionEnd_SESSION_END_ALREADY_RELEASED, 0},
		{"expired", func(e *env, _ string) { e.svc.locks.ExpireBefore(e.clock.Advance(time.Minute)) },
			pegadv1.SessionEnd_SESSION_END_EXPIRED, 1},
		{"force released", func(e *env, id string) {
			if _, err := e.svc.locks.ForceRelease(id, "alice@host"); err != nil {
				panic(err)
			}
		}, pegadv1.SessionEnd_SESSION_END_FORCE_RELEASED, 1},
		{"requester restarted", func(e *env, _ string) {
			if _, err := e.svc.ObserveIncarnation("owner", "inc-2"); err != nil {
				panic(err)
			}
		}, pegadv1.SessionEnd_SESSION_END_REQUESTER_RESTARTED, 1},
		{"shutdown", func(e *env, _ string) { e.svc.locks.ReleaseAll("test") },
			pegadv1.SessionEnd_SESSION_END_FORCE_RELEASED, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil)
			c := e.client(t)
			id := e.open(t, "owner", "inc-1", 4)
			if tc.end != nil {
				tc.end(e, id)
			}
			for try := 0; try < 2; try++ {
				resp, err := c.ReleaseTransferLock(ctxT(t), &pegadv1.ReleaseTransferLockRequest{SessionId: id, RequesterId: "owner"})
				if err != nil {
					t.Fatal(err)
				}
				wantEnd, wantLive, wantN := tc.wantEnd, tc.end == nil, uint32(4)
				if try == 1 && tc.end == nil {
					wantEnd, wantLive = pegadv1.SessionEnd_SESSION_END_ALREADY_RELEASED, false
				}
				if !wantLive {
					wantN = 0
				}
				if resp.End != wantEnd || resp.WasLive != wantLive || resp.ReleasedBlocks != wantN {
					t.Fatalf("try %d: got end=%v live=%v n=%d, want end=%v live=%v n=%d",
						try, resp.End, resp.WasLive, resp.ReleasedBlocks, wantEnd, wantLive, wantN)
				}
			}
			if got := e.state().notLive; got != 2*tc.notLive {
				t.Fatalf("release_not_live_total = %v, want %v", got, 2*tc.notLive)
			}
			if e.svc.Locks().Len() != 0 || e.state().gActive != 0 || e.state().gLocked != 0 {
				t.Fatalf("leftover: %+v", e.state())
			}
			e.pins.check(t, 0)
		})
	}
}

func TestReleaseForgottenSessionIsNotFound(t *testing.T) {
	e := newEnv(t, func(o *Options) { o.Tombstones = numShards }) // one per shard
	ids := map[*shard][]string{}
	var victim string
	for victim == "" {
		id := e.open(t, "owner", "", 1)
		raw, err := parseID(id)
		if err != nil {
			t.Fatal(err)
		}
		sh := e.svc.locks.shardOf(raw)
		ids[sh] = append(ids[sh], id)
		if len(ids[sh]) == 2 {
			victim = ids[sh][0]
			for _, id := range ids[sh] {
				if _, err := e.svc.locks.Release(id, "owner", ""); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	_, err := e.svc.locks.Release(victim, "owner", "")
	if !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("release of a forgotten session: %v, want ErrUnknownSession", err)
	}
	e.svc.locks.ReleaseAll("test")
	e.pins.check(t, 0)
}

func TestExpiryWithFakeClock(t *testing.T) {
	e := newEnv(t, nil) // timeout 10s
	t0 := e.clock.Now()
	early := e.open(t, "r1", "i", 3)
	e.clock.Advance(4 * time.Second)
	late := e.open(t, "r2", "i", 5)

	if n := e.svc.locks.ExpireBefore(t0.Add(10*time.Second - time.Nanosecond)); n != 0 {
		t.Fatalf("expired %d before any deadline", n)
	}
	if n := e.svc.locks.ExpireBefore(t0.Add(10 * time.Second)); n != 1 {
		t.Fatalf("expired %d at the first deadline, want 1", n)
	}
	if s := e.svc.locks.Sessions(); len(s) != 1 || s[0].ID != late || s[0].Blocks != 5 || s[0].RequesterID != "r2" {
		t.Fatalf("after first expiry sessions = %+v", s)
	}
	st := e.state()
	if st.timeouts != 1 || st.gActive != 1 || st.gLocked != 5 || st.outstanding != 5 {
		t.Fatalf("after first expiry: %+v", st)
	}
	logs := e.logs.entries(t, "Transfer lock expired")
	if len(logs) != 1 {
		t.Fatalf("%d expiry logs, want 1", len(logs))
	}
	l := logs[0]
	if l["level"] != "warn" || l["session"] != early || l["requester"] != "r1" || l["blocks"] != float64(3) || l["age"] == nil {
		t.Fatalf("expiry log = %v", l)
	}
	if n := e.svc.locks.ExpireBefore(t0.Add(time.Hour)); n != 1 {
		t.Fatalf("second expiry: %d", n)
	}
	if st := e.state(); st.timeouts != 2 || st.gActive != 0 || st.gLocked != 0 || st.sessions != 0 {
		t.Fatalf("after all expired: %+v", st)
	}
	e.pins.check(t, 0)
}

func TestOwnershipAndForceRelease(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client(t)
	id := e.open(t, "owner", "", 2)
	_, err := c.ReleaseTransferLock(ctxT(t), &pegadv1.ReleaseTransferLockRequest{SessionId: id, RequesterId: "intruder"})
	wantCode(t, err, codes.PermissionDenied, "")
	_, err = c.RenewTransferLock(ctxT(t), &pegadv1.RenewTransferLockRequest{SessionId: id, Requester: req("intruder", "")})
	wantCode(t, err, codes.PermissionDenied, "")
	if e.svc.Locks().Len() != 1 {
		t.Fatal("intruder changed the table")
	}
	n, err := e.svc.Locks().ForceRelease(id, "alice@host")
	if err != nil || n != 2 {
		t.Fatalf("ForceRelease = %d, %v", n, err)
	}
	logs := e.logs.entries(t, "Transfer lock force-released")
	if len(logs) != 1 || logs[0]["operator"] != "alice@host" || logs[0]["session"] != id {
		t.Fatalf("force-release log = %v", logs)
	}
	if _, err := e.svc.Locks().ForceRelease(id, "alice@host"); !errors.Is(err, ErrUnknownSession) {
		t.Fatalf("second ForceRelease: %v", err)
	}
	if _, err := e.svc.Locks().ForceRelease("nope", "alice@host"); !errors.Is(err, ErrInvalidSessionID) {
		t.Fatalf("malformed ForceRelease: %v", err)
	}
	// After a force release the tombstone still belongs to the owner.
	_, err = c.ReleaseTransferLock(ctxT(t), &pegadv1.ReleaseTransferLockRequest{SessionId: id, RequesterId: "intruder"})
	wantCode(t, err, codes.PermissionDenied, "")
	st := e.state()
	if st.force != 1 || st.sessions != 0 || st.outstanding != 0 {
		t.Fatalf("after force release: %+v", st)
	}
	for code, want := range map[string]float64{"OK": 1, "NotFound": 1, "InvalidArgument": 1} {
		if got := e.rpcCount(metrics.RPCForceRelease, code); got != want {
			t.Fatalf("holder_rpc_total{admin_release_lock,%s} = %v, want %v", code, got, want)
		}
	}
	e.pins.check(t, 0)
}

type fakeAcceptor struct{ calls int }

func (a *fakeAcceptor) Accept(ctx context.Context, r *pegadv1.RdmaHandshakeRequest) (*pegadv1.RdmaHandshakeResponse, error) {
	a.calls++
	return &pegadv1.RdmaHandshakeResponse{HolderNodeId: "holder"}, nil
}

func TestIncarnationReclaim(t *testing.T) {
	acc := &fakeAcceptor{}
	e := newEnv(t, func(o *Options) { o.Acceptor = acc })
	c := e.client(t)
	a1 := []string{e.open(t, "A", "a-1", 1), e.open(t, "A", "a-1", 2), e.open(t, "A", "a-1", 3)}
	b := e.open(t, "B", "b-1", 4)
	legacy := e.open(t, "A", "", 5) // no incarnation: never reclaimed

	// A restarts: its first query (finding nothing) reclaims its old sessions.
	if _, err := c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("x")}, Requester: req("A", "a-2"),
	}); err != nil {
		t.Fatal(err)
	}
	st := e.state()
	if st.reclaims != 3 || st.sessions != 2 || st.outstanding != 9 || st.gLocked != 9 {
		t.Fatalf("after restart: %+v", st)
	}
	if logs := e.logs.entries(t, "Requester restarted: released its old transfer locks"); len(logs) != 1 || logs[0]["sessions"] != float64(3) {
		t.Fatalf("reclaim log = %v", logs)
	}
	for _, id := range a1 {
		r, err := c.ReleaseTransferLock(ctxT(t), &pegadv1.ReleaseTransferLockRequest{SessionId: id, Requester: req("A", "a-2")})
		if err != nil || r.End != pegadv1.SessionEnd_SESSION_END_REQUESTER_RESTARTED || r.WasLive {
			t.Fatalf("release of reclaimed session: %v %v", r, err)
		}
	}
	// The old incarnation is refused everywhere.
	_, err := c.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("x")}, Requester: req("A", "a-1"),
	})
	wantCode(t, err, codes.FailedPrecondition, "stale")
	_, err = c.RdmaHandshake(ctxT(t), &pegadv1.RdmaHandshakeRequest{Requester: req("A", "a-1")})
	wantCode(t, err, codes.FailedPrecondition, "stale")
	if acc.calls != 0 {
		t.Fatal("acceptor called for a stale incarnation")
	}
	// A third start seen first by a handshake reclaims a-2's sessions.
	a2 := e.open(t, "A", "a-2", 6)
	if _, err := c.RdmaHandshake(ctxT(t), &pegadv1.RdmaHandshakeRequest{Requester: req("A", "a-3")}); err != nil {
		t.Fatal(err)
	}
	if acc.calls != 1 {
		t.Fatalf("acceptor calls = %d", acc.calls)
	}
	if _, _, err := e.svc.locks.Renew(a2, "A", "a-3"); !errors.Is(err, ErrSessionEnded) {
		t.Fatalf("renew of reclaimed session: %v", err)
	}
	if got := e.state().reclaims; got != 4 {
		t.Fatalf("reclaims = %v, want 4", got)
	}
	// B and the legacy session are untouched.
	for _, id := range []string{b, legacy} {
		if _, _, err := e.svc.locks.Renew(id, map[string]string{b: "B", legacy: "A"}[id], ""); err != nil {
			t.Fatalf("untouched session %s: %v", id, err)
		}
	}
	e.svc.locks.ReleaseAll("test")
	e.pins.check(t, 0)
}

func TestRenewBounds(t *testing.T) {
	e := newEnv(t, nil) // timeout 10s, max lifetime 25s
	c := e.client(t)
	t0 := e.clock.Now()
	id := e.open(t, "r", "", 1)
	renew := func() (*pegadv1.RenewTransferLockResponse, error) {
		return c.RenewTransferLock(ctxT(t), &pegadv1.RenewTransferLockRequest{SessionId: id, Requester: req("r", "")})
	}
	steps := []struct {
		at       time.Duration
		expires  time.Duration // 0: expect FailedPrecondition
		leftover time.Duration
	}{
		{5 * time.Second, 15 * time.Second, 20 * time.Second},
		{14 * time.Second, 24 * time.Second, 11 * time.Second},
		{20 * time.Second, 25 * time.Second, 5 * time.Second}, // capped at created+max lifetime
		{22 * time.Second, 0, 0},                              // nothing left to extend
	}
	for _, st := range steps {
		e.clock.Set(t0.Add(st.at))
		r, err := renew()
		if st.expires == 0 {
			wantCode(t, err, codes.FailedPrecondition, "maximum lifetime")
			continue
		}
		if err != nil {
			t.Fatalf("renew at %v: %v", st.at, err)
		}
		if got := r.ExpiresAt.AsTime().Sub(t0); got != st.expires {
			t.Fatalf("renew at %v: expires at +%v, want +%v", st.at, got, st.expires)
		}
		if got := r.LifetimeLeft.AsDuration(); got != st.leftover {
			t.Fatalf("renew at %v: lifetime left %v, want %v", st.at, got, st.leftover)
		}
	}
	if s := e.svc.locks.Sessions(); len(s) != 1 || s[0].Renewals != 3 || !s[0].ExpiresAt.Equal(t0.Add(25*time.Second)) {
		t.Fatalf("sessions = %+v", s)
	}
	if got := e.state().renewals; got != 3 {
		t.Fatalf("renewals_total = %v, want 3", got)
	}
	if n := e.svc.locks.ExpireBefore(t0.Add(25*time.Second - time.Nanosecond)); n != 0 {
		t.Fatal("expired before the renewed deadline")
	}
	if n := e.svc.locks.ExpireBefore(t0.Add(25 * time.Second)); n != 1 {
		t.Fatal("did not expire at the lifetime bound")
	}
	_, err := renew()
	wantCode(t, err, codes.NotFound, "expired")
	e.pins.check(t, 0)
}

func TestHandshake(t *testing.T) {
	e := newEnv(t, nil)
	c := e.client(t)
	_, err := c.RdmaHandshake(ctxT(t), &pegadv1.RdmaHandshakeRequest{Requester: req("n", "i")})
	wantCode(t, err, codes.Unavailable, "rdma not configured")
	if got := e.rpcCount(metrics.RPCHandshake, "Unavailable"); got != 1 {
		t.Fatalf("holder_rpc_total{rdma_handshake,Unavailable} = %v", got)
	}
}

func TestRecoveryInterceptor(t *testing.T) {
	logs := &syncBuffer{}
	ic := RecoveryInterceptor(zerolog.New(logs))
	resp, err := ic(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x/Y"},
		func(context.Context, any) (any, error) { panic("boom") })
	wantCode(t, err, codes.Internal, "/x/Y")
	if resp != nil {
		t.Fatalf("resp = %v", resp)
	}
	if len(logs.entries(t, "gRPC handler panicked")) != 1 {
		t.Fatal("panic not logged")
	}
	resp, err = ic(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x/Y"},
		func(context.Context, any) (any, error) { return "ok", nil })
	if err != nil || resp != "ok" {
		t.Fatalf("pass-through: %v %v", resp, err)
	}
}

func TestParseSessionID(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{strings.Repeat("0f", 16), strings.Repeat("0f", 16), true},
		{strings.Repeat("AB", 16), strings.Repeat("ab", 16), true},
		{"", "", false},
		{strings.Repeat("g0", 16), "", false},
		{strings.Repeat("a", 31), "", false},
		{strings.Repeat("é", 16), "", false},
	}
	for _, tc := range tests {
		got, err := ParseSessionID(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseSessionID(%q) = %q, %v", tc.in, got, err)
		}
	}
	id := newID()
	if w := id.String(); len(w) != idLen {
		t.Fatalf("newID wire length %d", len(w))
	} else if back, err := parseID(strings.ToUpper(w)); err != nil || back != id {
		t.Fatalf("parseID(%q) = %v, %v; want %v", w, back, err, id)
	}
}
