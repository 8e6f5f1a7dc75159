package store

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/replay"
	"github.com/rs/zerolog"
)

// fragResult is what one policy cost on the mixed-size trace.
type fragResult struct {
	hit             float64 // prefix hit ratio
	evictions       uint64
	evictedPerNeed  float64 // bytes evicted ÷ bytes the evicting allocations asked for
	meanSpans       float64 // free ranges in the pool, mean after each request
	maxSpans        int
	largestFreeMean float64 // largest free range, mean after each request, KiB
}

// chainBlockSize gives each chain a size by its head, so one chain (one
// model) has one block size and the pool holds 4, 8 and 16 KiB blocks
// side by side.
func chainBlockSize(head uint64) uint64 { return 4096 << (head % 3) }

// replayStore drives s as the daemon is driven by a replay (pegactl bench
// replay): look the chain up (pinning what is held, which teaches the
// store the chain), count the prefix held, unpin, put the missing blocks
// after it.
func replayStore(t *testing.T, s *Store, reqs []replay.Request) fragResult {
	t.Helper()
	var hits, accesses uint64
	var spans, largest float64
	var r fragResult
	for _, req := range reqs {
		size := chainBlockSize(req.HashIDs[0])
		keys := make([]Key, len(req.HashIDs))
		for i, id := range req.HashIDs {
			keys[i] = Key{Namespace: "frag", Hash: string(binary.BigEndian.AppendUint64(nil, id))}
		}
		pinned, missing := s.Pin(keys)
		held := len(keys)
		if len(missing) > 0 {
			held = missing[0]
		}
		hits += uint64(held)
		accesses += uint64(len(keys))
		s.Unpin(pinned)
		for _, k := range keys[held:] {
			if _, err := s.Put(k, []SlotSize{{KSize: size}}, func([]byte) error { return nil }); err != nil {
				t.Fatalf("put: %v", err)
			}
		}
		ps := s.Pool().Stats()
		spans += float64(ps.FreeSpans)
		largest += float64(ps.LargestFree) / 1024
		r.maxSpans = max(r.maxSpans, ps.FreeSpans)
	}
	st := s.Stats()
	r.hit = float64(hits) / float64(accesses)
	r.evictions = st.Evictions
	r.evictedPerNeed = float64(st.EvictedBytes) / float64(st.EvictNeedBytes)
	r.meanSpans = spans / float64(len(reqs))
	r.largestFreeMean = largest / float64(len(reqs))
	return r
}

// TestFragmentationTrace measures what each policy costs in contiguity:
// the Mooncake trace with 4/8/16 KiB blocks (by chain) through a real
// store and pool at 5 and 20 % of the trace's bytes. Extents stay
// contiguous, so evicting for a 16 KiB block may take more than 16 KiB
// of smaller blocks; the figures go in docs/tiering.md (run with -v).
func TestFragmentationTrace(t *testing.T) {
	if testing.Short() {
		t.Skip("trace replay")
	}
	reqs, err := replay.ReadTraceFile("../replay/testdata/mooncake_fast25_synthetic_trace.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	var total uint64 // bytes of the trace's unique blocks
	seen := map[uint64]bool{}
	for _, r := range reqs {
		for _, id := range r.HashIDs {
			if !seen[id] {
				seen[id] = true
				total += chainBlockSize(r.HashIDs[0])
			}
		}
	}
	t.Logf("%-6s %-7s %8s %9s %15s %10s %9s %15s", "share", "policy", "hit", "evictions", "evicted/needed", "mean_spans", "max_spans", "mean_largest_KiB")
	for _, share := range []uint64{5, 20} {
		size := (total * share / 100) &^ (pool.Alignment - 1)
		for _, kind := range []evict.Kind{evict.KindLRU, evict.KindPrefix, evict.KindAdaptive} {
			p, err := pool.New(pool.Options{Size: size, Log: zerolog.Nop()})
			if err != nil {
				t.Fatal(err)
			}
			r := replayStore(t, NewWithPolicy(p, nil, NewPolicy(kind)), reqs)
			_ = p.Close()
			t.Logf("%-6s %-7s %8.3f %9d %15.3f %10.1f %9d %15.0f", fmt.Sprint(share, "%"), kind, r.hit, r.evictions, r.evictedPerNeed, r.meanSpans, r.maxSpans, r.largestFreeMean)
			if r.evictions == 0 || !(r.evictedPerNeed >= 1) {
				t.Errorf("%s at %d %%: %d evictions, evicted/needed %.3f (want evictions, ratio ≥ 1)", kind, share, r.evictions, r.evictedPerNeed)
			}
		}
	}
}
