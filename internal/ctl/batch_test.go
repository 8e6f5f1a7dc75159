package ctl

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
)

func TestBatches(t *testing.T) {
	const m = limits.MaxBlocksPerRequest
	for _, n := range []int{0, 1, m - 1, m, m + 1, 2*m + 3} {
		items := make([]int, n)
		for i := range items {
			items[i] = i
		}
		var got []int
		parts := batches(items)
		for _, p := range parts {
			if len(p) == 0 || len(p) > m || cap(p) != len(p) {
				t.Fatalf("n=%d: a batch of %d (cap %d), want 1..%d with no room to grow into the next", n, len(p), cap(p), m)
			}
			got = append(got, p...)
		}
		if want := (n + m - 1) / m; len(parts) != want || len(got) != n {
			t.Fatalf("n=%d: %d batches holding %d items, want %d holding %d", n, len(parts), len(got), want, n)
		}
		for i, v := range got {
			if v != i {
				t.Fatalf("n=%d: item %d is %d: order not kept", n, i, v)
			}
		}
	}
}

// fakePrefetch answers each request as the client would: refuses more
// than the limit, fetches every hash, and fails the call numbered failAt
// (1-based; 0: none) with an error beside the blocks' outcomes.
type fakePrefetch struct {
	calls  int
	failAt int
}

func (f *fakePrefetch) call(hashes [][]byte) (*pegaclient.PrefetchResult, error) {
	f.calls++
	if len(hashes) > limits.MaxBlocksPerRequest {
		return nil, status.Errorf(codes.InvalidArgument, "%d hashes (max %d per prefetch)", len(hashes), limits.MaxBlocksPerRequest)
	}
	res := &pegaclient.PrefetchResult{SessionID: fmt.Sprintf("s%d", f.calls), Duration: time.Second}
	st := pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED
	if f.calls == f.failAt {
		st = pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED
	}
	for _, h := range hashes {
		res.Blocks = append(res.Blocks, pegaclient.PrefetchBlock{Hash: h, Status: st})
		res.Bytes++
	}
	if f.calls != f.failAt {
		return res, nil
	}
	return res, status.Error(codes.Unavailable, "connection broken")
}

func TestPrefetchInBatches(t *testing.T) {
	const m = limits.MaxBlocksPerRequest
	hashes := make([][]byte, 2*m+1)
	for i := range hashes {
		hashes[i] = []byte{byte(i >> 8), byte(i)}
	}

	f := &fakePrefetch{}
	res, err := prefetchInBatches(hashes, f.call)
	if err != nil || f.calls != 3 || len(res.Blocks) != len(hashes) || res.Bytes != uint64(len(hashes)) ||
		res.SessionID != "s1,s2,s3" || res.Duration != 3*time.Second {
		t.Fatalf("%d hashes: %d calls, err %v, %d blocks, %d bytes, session %q, took %v; want 3 calls merged into one answer",
			len(hashes), f.calls, err, len(res.Blocks), res.Bytes, res.SessionID, res.Duration)
	}
	for i, b := range res.Blocks {
		if string(b.Hash) != string(hashes[i]) {
			t.Fatalf("block %d is %x, want %x: order not kept", i, b.Hash, hashes[i])
		}
	}

	f = &fakePrefetch{failAt: 2}
	res, err = prefetchInBatches(hashes, f.call)
	// The second batch fails as a whole: the third is not sent, and the
	// answer has the first's outcomes then the second's.
	if f.calls != 2 || len(res.Blocks) != 2*m || res.SessionID != "s1,s2" || status.Code(err) != codes.Unavailable {
		t.Fatalf("%d calls, %d blocks, session %q, err %v; want 2, %d, s1,s2, Unavailable", f.calls, len(res.Blocks), res.SessionID, err, 2*m)
	}
	if got := res.Blocks[m].Status; got != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED {
		t.Fatalf("the failed batch's block is %v", got)
	}

	// One batch: the call's own answer, and a failure's outcomes.
	f = &fakePrefetch{failAt: 1}
	res, err = prefetchInBatches(hashes[:3], f.call)
	if status.Code(err) != codes.Unavailable || len(res.Blocks) != 3 {
		t.Fatalf("one failed batch: %v, %d blocks; want Unavailable with the 3 blocks' outcomes", err, len(res.Blocks))
	}
}
