package ctl

import (
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// pegad takes at most limits.MaxBlocksPerRequest hashes per request
// (prefetch, locate). An operator's list is not bound by that: pegactl
// splits it into requests of the limit and shows one answer, so a script
// need not know the limit.

// batches splits items into runs of at most limits.MaxBlocksPerRequest,
// in order; none when items is empty. The runs share items' array.
func batches[T any](items []T) [][]T {
	var out [][]T
	for len(items) > 0 {
		n := min(len(items), limits.MaxBlocksPerRequest)
		out = append(out, items[:n:n])
		items = items[n:]
	}
	return out
}

// prefetchInBatches sends req as one Prefetch per batch of its hashes,
// through call, one after another, and merges the answers as if pegad had
// taken every hash at once: blocks in request order, bytes and durations
// summed, the batches' session ids joined with ",".
//
// A batch that fails stops it, and the later batches are not sent: a
// fetch that failed as a whole (a broken peer, a timeout) would fail the
// same way again. It then returns what the batches before it did with
// that batch's own outcomes after them (its answer's, or those its error
// carries), and the batch's error; the merged answer's Error is the
// failed batch's.
func prefetchInBatches(req *pegadv1.PrefetchRequest, call func(*pegadv1.PrefetchRequest) (*pegadv1.PrefetchResponse, error)) (*pegadv1.PrefetchResponse, error) {
	parts := batches(req.GetHashes())
	if len(parts) <= 1 {
		res, err := call(req)
		if err != nil {
			return failedPrefetch(err), err
		}
		return res, nil
	}
	merged := &pegadv1.PrefetchResponse{}
	var sessions []string
	var took time.Duration
	for _, hashes := range parts {
		one := proto.Clone(req).(*pegadv1.PrefetchRequest)
		one.Hashes = hashes
		res, err := call(one)
		if err != nil {
			res = failedPrefetch(err)
		}
		merged.Blocks = append(merged.Blocks, res.GetBlocks()...)
		merged.Bytes += res.GetBytes()
		took += res.GetDuration().AsDuration()
		if id := res.GetSessionId(); id != "" {
			sessions = append(sessions, id)
		}
		merged.Error = res.GetError()
		if err != nil || merged.Error != nil {
			merged.SessionId, merged.Duration = strings.Join(sessions, ","), durationpb.New(took)
			return merged, err
		}
	}
	merged.SessionId, merged.Duration = strings.Join(sessions, ","), durationpb.New(took)
	return merged, nil
}
