package requester

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestStagingChunkFitsANUMAPart (review finding): on a pool split over
// NUMA nodes no allocation can exceed one part, but staging asked for
// chunks of up to MaxChunk, so a 40 MiB fetch into a 64 MiB pool split
// over two nodes (32 MiB parts) failed "larger than a NUMA part" although
// its 1 MiB blocks fit. Chunks are now capped at the pool's largest
// allocation. Real store and pool; fake holder and READs.
func TestStagingChunkFitsANUMAPart(t *testing.T) {
	p, err := pool.New(pool.Options{Size: 64 * mib, Log: zerolog.Nop(), Nodes: []int{0, 1}, Policy: &testutil.FakeNUMA{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if p.MaxAlloc() >= 40*mib {
		t.Fatalf("pool MaxAlloc = %d, want the pool split in parts under 40 MiB", p.MaxAlloc())
	}
	hs := newHarness(t)
	st := store.New(p, hs.m)
	e, err := newEngine(Options{NodeID: "req-node", Incarnation: "inc-1", Peers: hs.e.peers, Metrics: hs.m,
		Log: zerolog.Nop()}, storeAdapter{s: st}, hs.cs, hooks{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Close() })
	hs.h.shape = func(string) ([]store.SlotSize, int, bool) {
		return []store.SlotSize{{KSize: mib / 2, VSize: mib / 2}}, 0, true
	}
	res, err := e.Prefetch(context.Background(), "peer:1", "ns", hashes("split", 40))
	if err != nil {
		t.Fatalf("prefetch of 40 x 1 MiB into a pool of two 32 MiB parts: %v", err)
	}
	for _, b := range res.Blocks {
		if b.Status != StatusFetched {
			t.Fatalf("block %s: %v %v", b.Hash, b.Status, b.Err)
		}
	}
	if res.Bytes != 40*mib {
		t.Errorf("bytes = %d, want 40 MiB", res.Bytes)
	}
	hs.h.checkReleasedOnce(t)
}

// TestStagingChunkCappedByStore: the chunk cap is the store's largest
// allocation, below MaxChunk.
func TestStagingChunkCappedByStore(t *testing.T) {
	hs := newHarness(t)
	hs.st.maxAlloc = 4 * mib
	hs.h.shape = func(string) ([]store.SlotSize, int, bool) {
		return []store.SlotSize{{KSize: mib}}, 0, true
	}
	if _, err := hs.e.Prefetch(context.Background(), "peer:1", "ns", hashes("cap", 10)); err != nil {
		t.Fatal(err)
	}
	if a := hs.st.allocSizes(); len(a) != 3 || a[0] != 4*mib || a[1] != 4*mib || a[2] != 2*mib {
		t.Errorf("allocations %v, want 4, 4 and 2 MiB", a)
	}
	hs.st.check(t)
}
