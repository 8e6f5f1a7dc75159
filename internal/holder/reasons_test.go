package holder

import (
	"context"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
)

// TestWireReasons: every refusal of the peer service carries its
// pegaderr reason beside its code, so a requester tells apart kinds that
// share a code (a stale incarnation and a used-up lifetime are both
// FailedPrecondition; an unknown and an ended session both NotFound).
func TestWireReasons(t *testing.T) {
	e := newEnv(t, func(o *Options) {
		o.Log = zerolog.Nop()
		o.LockTimeout, o.MaxLifetime = 10*time.Second, 10*time.Second // no renewal left
		o.Limits = Limits{SessionsPerPeer: 1}
		o.Authenticate = func(ctx context.Context) (string, []string, bool) {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("stranger")) > 0 {
				return "stranger", []string{"stranger"}, true
			}
			md, _ := metadata.FromIncomingContext(ctx)
			names := md.Get("node")
			return names[0], names, true
		}
	}, "a", "b")
	c := e.client(t)
	as := func(node string) context.Context {
		return metadata.AppendToOutgoingContext(ctxT(t), "node", node)
	}
	q, err := c.QueryBlocksForTransfer(as("r"), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("a")}, Requester: req("r", "i2")})
	if err != nil {
		t.Fatal(err)
	}
	sid := q.GetSessionId()
	release := func(ctx context.Context, node, inc, id string) error {
		_, err := c.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{SessionId: id, Requester: req(node, inc)})
		return err
	}
	e.svc.locks.ObserveIncarnation("r", "i3") // i2 is stale from now on (and its session reclaimed)
	q2, err := c.QueryBlocksForTransfer(as("r"), &pegadv1.QueryBlocksForTransferRequest{
		Namespace: "ns", Hashes: [][]byte{[]byte("a")}, Requester: req("r", "i3")})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		call   func() error
		code   codes.Code
		reason pegaderr.Reason
	}{
		{"malformed id", func() error { return release(as("r"), "r", "i3", "xyz") }, codes.InvalidArgument, pegaderr.InvalidSessionID},
		{"no node id", func() error { return release(as("r"), "", "", sid) }, codes.InvalidArgument, pegaderr.Invalid},
		{"unknown session", func() error { return release(as("r"), "r", "i3", "0123456789abcdef0123456789abcdef") }, codes.NotFound, pegaderr.UnknownSession},
		{"stale incarnation", func() error { return release(as("r"), "r", "i2", sid) }, codes.FailedPrecondition, pegaderr.StaleIncarnation},
		{"renew past the lifetime", func() error {
			_, err := c.RenewTransferLock(as("r"), &pegadv1.RenewTransferLockRequest{SessionId: q2.GetSessionId(), Requester: req("r", "i3")})
			return err
		}, codes.FailedPrecondition, pegaderr.LifetimeExhausted},
		{"renew of an ended session", func() error {
			_, err := c.RenewTransferLock(as("r"), &pegadv1.RenewTransferLockRequest{SessionId: sid, Requester: req("r", "i3")})
			return err
		}, codes.NotFound, pegaderr.SessionEnded},
		{"another's session", func() error { return release(as("s"), "s", "", q2.GetSessionId()) }, codes.PermissionDenied, pegaderr.NotOwner},
		{"claimed identity", func() error {
			return release(metadata.AppendToOutgoingContext(ctxT(t), "stranger", "1"), "r", "i3", sid)
		}, codes.PermissionDenied, pegaderr.Identity},
		{"over a limit", func() error {
			_, err := c.QueryBlocksForTransfer(as("r"), &pegadv1.QueryBlocksForTransferRequest{
				Namespace: "ns", Hashes: [][]byte{[]byte("b")}, Requester: req("r", "i3")})
			return err
		}, codes.ResourceExhausted, pegaderr.Limit},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, reason := pegaderr.FromStatus(tc.call())
			if code != tc.code || reason != tc.reason {
				t.Fatalf("got %v %q, want %v %q", code, reason, tc.code, tc.reason)
			}
		})
	}
}
