package ctl

import (
	"strings"

	"github.com/pegaflow/pegad/api/limits"
	pegaclient "github.com/pegaflow/pegad/client"
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

// prefetchInBatches sends hashes as one Prefetch per batch, through call,
// one after another, and merges the results as if pegad had taken every
// hash at once: blocks in request order, bytes and durations summed, the
// batches' session ids joined with ",".
//
// A batch that fails stops it, and the later batches are not sent: a
// fetch that failed as a whole (a broken peer, a timeout) would fail the
// same way again. It then returns what the batches before it did with
// that batch's own outcomes after them (those the client returned beside
// its error), and the batch's error. The result is never nil.
func prefetchInBatches(hashes [][]byte, call func([][]byte) (*pegaclient.PrefetchResult, error)) (*pegaclient.PrefetchResult, error) {
	merged := &pegaclient.PrefetchResult{}
	var sessions []string
	for _, part := range batches(hashes) {
		res, err := call(part)
		if res != nil {
			merged.Blocks = append(merged.Blocks, res.Blocks...)
			merged.Bytes += res.Bytes
			merged.Duration += res.Duration
			if res.SessionID != "" {
				sessions = append(sessions, res.SessionID)
			}
		}
		merged.SessionID = strings.Join(sessions, ",")
		if err != nil {
			return merged, err
		}
	}
	return merged, nil
}
