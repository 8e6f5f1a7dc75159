package ctl

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
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

// fakePrefetch answers each request as a daemon would: refuses more than
// the limit, fetches every hash, and fails the call numbered failAt (1-based;
// 0: none) with a status, or in the answer when inResponse.
type fakePrefetch struct {
	calls      int
	failAt     int
	inResponse bool
}

func (f *fakePrefetch) call(req *pegadv1.PrefetchRequest) (*pegadv1.PrefetchResponse, error) {
	f.calls++
	if len(req.GetHashes()) > limits.MaxBlocksPerRequest {
		return nil, status.Errorf(codes.InvalidArgument, "%d hashes (max %d per prefetch)", len(req.GetHashes()), limits.MaxBlocksPerRequest)
	}
	res := &pegadv1.PrefetchResponse{SessionId: fmt.Sprintf("s%d", f.calls), Duration: durationpb.New(time.Second)}
	st := pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED
	if f.calls == f.failAt {
		st = pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED
	}
	for _, h := range req.GetHashes() {
		res.Blocks = append(res.Blocks, &pegadv1.PrefetchBlockResult{Hash: h, Status: st})
		res.Bytes++
	}
	if f.calls != f.failAt {
		return res, nil
	}
	if f.inResponse {
		res.Error = &pegadv1.PrefetchFailure{Code: int32(codes.Unavailable), Message: "connection broken"}
		return res, nil
	}
	s, _ := status.New(codes.Unavailable, "connection broken").WithDetails(res)
	return nil, s.Err()
}

func TestPrefetchInBatches(t *testing.T) {
	const m = limits.MaxBlocksPerRequest
	hashes := make([][]byte, 2*m+1)
	for i := range hashes {
		hashes[i] = []byte{byte(i >> 8), byte(i)}
	}
	req := &pegadv1.PrefetchRequest{Peer: "h:1", Namespace: "ns", Hashes: hashes}

	f := &fakePrefetch{}
	res, err := prefetchInBatches(req, f.call)
	if err != nil || f.calls != 3 || len(res.GetBlocks()) != len(hashes) || res.GetBytes() != uint64(len(hashes)) ||
		res.GetSessionId() != "s1,s2,s3" || res.GetDuration().AsDuration() != 3*time.Second || res.GetError() != nil {
		t.Fatalf("%d hashes: %d calls, err %v, %d blocks, %d bytes, session %q, took %v; want 3 calls merged into one answer",
			len(hashes), f.calls, err, len(res.GetBlocks()), res.GetBytes(), res.GetSessionId(), res.GetDuration().AsDuration())
	}
	for i, b := range res.GetBlocks() {
		if string(b.GetHash()) != string(hashes[i]) {
			t.Fatalf("block %d is %x, want %x: order not kept", i, b.GetHash(), hashes[i])
		}
	}
	if len(req.GetHashes()) != len(hashes) {
		t.Fatalf("the caller's request was changed")
	}

	for _, inResponse := range []bool{false, true} {
		f := &fakePrefetch{failAt: 2, inResponse: inResponse}
		res, err := prefetchInBatches(req, f.call)
		// The second batch fails as a whole: the third is not sent, and
		// the answer has the first's outcomes then the second's.
		if f.calls != 2 || len(res.GetBlocks()) != 2*m || res.GetSessionId() != "s1,s2" {
			t.Fatalf("inResponse=%v: %d calls, %d blocks, session %q; want 2, %d, s1,s2", inResponse, f.calls, len(res.GetBlocks()), res.GetSessionId(), 2*m)
		}
		if got := res.GetBlocks()[m].GetStatus(); got != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED {
			t.Fatalf("inResponse=%v: the failed batch's block is %v", inResponse, got)
		}
		if inResponse != (err == nil) || inResponse != (res.GetError() != nil) {
			t.Fatalf("inResponse=%v: err %v, answer's error %v", inResponse, err, res.GetError())
		}
	}

	// One batch: the call's own answer, and a failure's details.
	f = &fakePrefetch{failAt: 1}
	res, err = prefetchInBatches(&pegadv1.PrefetchRequest{Hashes: hashes[:3]}, f.call)
	if status.Code(err) != codes.Unavailable || len(res.GetBlocks()) != 3 {
		t.Fatalf("one failed batch: %v, %d blocks; want Unavailable with the 3 blocks' outcomes", err, len(res.GetBlocks()))
	}
}
