package requester

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
)

// reconnectingHolder is the fake holder behind a channel that can be told
// to reconnect (as peer.Clients' clients can).
type reconnectingHolder struct {
	*fakeHolder
	reconnects atomic.Int32
	// down: Reconnect finds the channel still down.
	down bool
}

func (h *reconnectingHolder) Reconnect(ctx context.Context) error {
	h.reconnects.Add(1)
	if h.down {
		<-ctx.Done() // waits out the bounded reconnect wait
		return ctx.Err()
	}
	return nil
}

// unreachable is what a gRPC channel in reconnect backoff answers right
// after a link came back: the cut-time dial error.
var unreachable = status.Error(codes.Unavailable,
	`connection error: desc = "transport: Error while dialing: dial tcp 10.0.0.1:50055: connect: network is unreachable"`)

// TestStaleChannelRetriedBeforeLock (review finding): right after a link
// came back, the first prefetch failed at once on the peer's stale gRPC
// channel (Unavailable, "network is unreachable"), in the handshake or the
// query. Nothing was locked then, so the fetch now makes the channel
// reconnect and runs connect and lock once more. Only once, only for
// Unavailable, and not when the channel does not come back.
func TestStaleChannelRetriedBeforeLock(t *testing.T) {
	handshakeDown := fmt.Errorf("%w: handshake with peer:1: %w", conn.ErrConnectionBroken, unreachable)
	cases := []struct {
		name        string
		queryErr    func(n int) error // nth query (from 1)
		getErr      func(n int) error // nth connect (from 1)
		down        bool              // Reconnect does not bring the channel back
		wantErr     bool
		wantQueries int // query RPCs that reached the fake
		wantGets    int
		wantRecon   int32
	}{
		{name: "query on a stale channel", queryErr: nth(1, unreachable), wantQueries: 2, wantGets: 2, wantRecon: 1},
		{name: "handshake on a stale channel", getErr: nth(1, handshakeDown), wantQueries: 1, wantGets: 2, wantRecon: 1},
		{name: "channel down twice: one retry only", queryErr: always(unreachable), wantErr: true, wantQueries: 2, wantGets: 2, wantRecon: 1},
		{name: "channel not back: no retry", queryErr: always(unreachable), down: true, wantErr: true, wantQueries: 1, wantGets: 1, wantRecon: 1},
		{name: "refused query: no retry", queryErr: always(status.Error(codes.PermissionDenied, "no")), wantErr: true, wantQueries: 1, wantGets: 1},
		{name: "handshake rejected: no retry", getErr: always(fmt.Errorf("%w: by peer:1: %w", conn.ErrHandshakeRejected,
			status.Error(codes.InvalidArgument, "bad"))), wantErr: true, wantQueries: 0, wantGets: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var queries atomic.Int32
			var rh *reconnectingHolder
			hs := newHarness(t, func(hs *harness, o *Options) {
				rh = &reconnectingHolder{fakeHolder: hs.h, down: tc.down}
				o.Peers = func(string) (pegadv1.PeerServiceClient, error) { return rh, nil }
				hs.cs.getErrN = tc.getErr
				hs.h.queryErr = func() error {
					n := int(queries.Add(1))
					if tc.queryErr != nil {
						return tc.queryErr(n)
					}
					return nil
				}
			})
			hs.e.reconnectWait = 50 * time.Millisecond
			res, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("h", 3))
			if tc.wantErr {
				var fe *FetchError
				if !errors.As(err, &fe) {
					t.Fatalf("err = %v, want a FetchError", err)
				}
			} else {
				if err != nil {
					t.Fatalf("prefetch: %v", err)
				}
				for _, b := range res.Blocks {
					if b.Status != StatusFetched {
						t.Fatalf("block %s: %v %v", b.Hash, b.Status, b.Err)
					}
				}
			}
			if got := int(queries.Load()); got != tc.wantQueries {
				t.Errorf("queries = %d, want %d", got, tc.wantQueries)
			}
			hs.cs.mu.Lock()
			gets := hs.cs.gets
			hs.cs.mu.Unlock()
			if gets != tc.wantGets {
				t.Errorf("connects = %d, want %d", gets, tc.wantGets)
			}
			if got := rh.reconnects.Load(); got != tc.wantRecon {
				t.Errorf("reconnects = %d, want %d", got, tc.wantRecon)
			}
			hs.h.checkReleasedOnce(t)
		})
	}
}

func nth(n int, err error) func(int) error {
	return func(i int) error {
		if i == n {
			return err
		}
		return nil
	}
}

func always(err error) func(int) error { return func(int) error { return err } }
