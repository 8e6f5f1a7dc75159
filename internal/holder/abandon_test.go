package holder

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// pinHook is a fakePinner that runs onPin once the blocks are pinned: the
// moment the holder is about to grant.
type pinHook struct {
	*fakePinner
	onPin func()
}

func (p pinHook) PinChain(ns string, hashes [][]byte) ([]*store.Block, []int) {
	pinned, missing := p.fakePinner.PinChain(ns, hashes)
	p.onPin()
	return pinned, missing
}

// TestQueryAbandonedAtGrant: a query whose caller goes (cancelled, or
// past its deadline) right as the holder grants it cannot be answered, so
// its session ends at once — no live session, no pinned block — counted
// as abandoned (not as a release by its requester, which never had the
// id), and the RPC is counted with the caller's code.
func TestQueryAbandonedAtGrant(t *testing.T) {
	tests := []struct {
		name string
		gone func(cancel context.CancelFunc) // makes the caller's context done
		code codes.Code
	}{
		{"cancelled", func(cancel context.CancelFunc) { cancel() }, codes.Canceled},
		{"deadline", nil, codes.DeadlineExceeded},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, nil, "a", "b")
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var onPin func()
			if tc.gone != nil {
				onPin = func() { tc.gone(cancel) }
			} else {
				var dcancel context.CancelFunc
				ctx, dcancel = context.WithDeadline(ctx, time.Now().Add(-time.Second)) // already past
				defer dcancel()
				onPin = func() {}
			}
			e.svc.opts.Store = pinHook{e.pins, onPin}
			resp, err := e.svc.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
				Namespace: "ns", Hashes: [][]byte{[]byte("a"), []byte("b")}, Requester: req("r", "i1")})
			if status.Code(err) != tc.code || resp != nil {
				t.Fatalf("query: %v %v, want %v", resp, err, tc.code)
			}
			if st := e.state(); st.sessions != 0 || st.locked != 0 || st.gActive != 0 || st.timeouts != 0 {
				t.Fatalf("after an abandoned grant: %+v, want nothing live", st)
			}
			e.pins.check(t, 0)
			ends := func(o string) float64 { return metrics.Value(e.m.SessionEnds.WithLabelValues(o)) }
			if g := metrics.Value(e.m.SessionsGranted); g != 1 || ends(metrics.OutcomeAbandoned) != 1 || ends(metrics.OutcomeReleased) != 0 {
				t.Fatalf("granted %v, abandoned %v, released %v; want 1, 1, 0",
					g, ends(metrics.OutcomeAbandoned), ends(metrics.OutcomeReleased))
			}
			if got := e.rpcCount(metrics.RPCQueryBlocks, tc.code.String()); got != 1 {
				t.Fatalf("holder_rpc_total{query,%v} = %v", tc.code, got)
			}
			if logs := e.logs.entries(t, "Transfer lock abandoned: its query's caller had gone"); len(logs) != 1 || logs[0]["requester"] != "r" {
				t.Fatalf("abandon log: %v", logs)
			}
		})
	}
}
