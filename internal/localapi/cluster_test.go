package localapi

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/requester"
)

// A Prefetch with no peer goes to the fetcher (which asks the cluster
// index); its answers carry the serving node, and index errors map to
// clear codes.
func TestPrefetchWithoutPeer(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		res  *requester.Result
		err  error
		code codes.Code
	}{
		{"served", &requester.Result{Blocks: []requester.BlockResult{
			{Hash: []byte{1}, Status: requester.StatusFetched, Node: "n2"},
			{Hash: []byte{2}, Status: requester.StatusNotFound},
		}}, nil, codes.OK},
		{"no index", nil, fmt.Errorf("prefetch: %w", index.ErrDisabled), codes.FailedPrecondition},
		{"index down", nil, fmt.Errorf("locate: %w: dial", index.ErrUnavailable), codes.Unavailable},
		{"nothing", nil, nil, codes.Internal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 1<<20, true)
			e.fetcher.res, e.fetcher.err = tc.res, tc.err
			resp, err := e.local.Prefetch(ctx, &pegadv1.PrefetchRequest{Namespace: "ns", Hashes: [][]byte{{1}, {2}}})
			if status.Code(err) != tc.code {
				t.Fatalf("code %v (%v), want %v", status.Code(err), err, tc.code)
			}
			if e.fetcher.gotPeer != "" || e.fetcher.gotN != 2 {
				t.Fatalf("fetcher got peer %q, %d hashes", e.fetcher.gotPeer, e.fetcher.gotN)
			}
			if tc.code != codes.OK {
				return
			}
			b := resp.GetBlocks()
			if b[0].GetNode() != "n2" || b[0].GetStatus() != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED ||
				b[1].GetStatus() != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_NOT_FOUND {
				t.Fatalf("blocks %v", b)
			}
		})
	}
}
