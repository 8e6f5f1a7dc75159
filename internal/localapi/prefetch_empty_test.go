package localapi

import (
	"context"
	"testing"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/requester"
)

// TestEmptyPrefetchIsANoOp: prefetch(ns, hashes[hit.local:hit.n]) with
// nothing missing (issue 33, item 9) succeeds with no outcomes and never
// reaches the prefetch engine, with a peer or without (the cluster index).
func TestEmptyPrefetchIsANoOp(t *testing.T) {
	tests := []struct {
		name string
		req  *pegadv1.PrefetchRequest
	}{
		{"peer, nil hashes", &pegadv1.PrefetchRequest{Peer: "h:1", Namespace: "ns"}},
		{"peer, empty hashes", &pegadv1.PrefetchRequest{Peer: "h:1", Namespace: "ns", Hashes: [][]byte{}}},
		{"cluster index", &pegadv1.PrefetchRequest{Namespace: "ns"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, 2<<20, true)
			e.fetcher.res = &requester.Result{Blocks: []requester.BlockResult{{Hash: []byte{9}, Status: requester.StatusFetched}}}
			resp, err := e.local.Prefetch(context.Background(), tc.req)
			if err != nil {
				t.Fatalf("empty prefetch: %v, want success", err)
			}
			if len(resp.GetBlocks()) != 0 || resp.GetBytes() != 0 || resp.GetSessionId() != "" {
				t.Fatalf("empty prefetch answered %v, want no blocks, no bytes, no session", resp)
			}
			if e.fetcher.gotNS != "" {
				t.Fatalf("the prefetch engine was asked (namespace %q, %d hashes)", e.fetcher.gotNS, e.fetcher.gotN)
			}
		})
	}
}
