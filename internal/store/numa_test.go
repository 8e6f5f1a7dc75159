package store

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestAllocExtentOnNode: staging asked for on a NUMA node lands there while
// that node's part has room, then on the other node before anything is
// evicted.
func TestAllocExtentOnNode(t *testing.T) {
	p, err := pool.New(pool.Options{Size: 8 << 20, Log: zerolog.Nop(), Nodes: []int{0, 1}, Policy: &testutil.FakeNUMA{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	s := New(p, nil)
	for _, tc := range []struct {
		node   int
		n      uint64
		wantOn int
	}{{1, 3 << 20, 1}, {0, 1 << 20, 0}, {1, 1 << 20, 1}, {1, 1 << 20, 0}} {
		x, err := s.AllocExtentOn(tc.node, tc.n)
		if err != nil {
			t.Fatal(err)
		}
		if got := x.Alloc().NUMA; got != tc.wantOn || p.NodeOf(p.Addr(x.Alloc())) != tc.wantOn {
			t.Fatalf("AllocExtentOn(%d, %d) on node %d, want %d", tc.node, tc.n, got, tc.wantOn)
		}
	}
}

// TestEvictionRespectsNUMAParts: free runs never merge across a NUMA part
// boundary of the pool, so the evictor plans with that: an extent that
// fits in no part even after evicting every unpinned block (one pinned
// block per 4 MiB part leaves 3 MiB runs) fails with ErrNoSpace and
// evicts nothing, as does one larger than a part. Puts spread over the
// parts (pool.Alloc: the part with the most free bytes), so blocks
// 0,2,4,6 are on part 0 and 1,3,5,7 on part 1.
func TestEvictionRespectsNUMAParts(t *testing.T) {
	p, err := pool.New(pool.Options{Size: 8 << 20, Log: zerolog.Nop(), Nodes: []int{0, 1}, Policy: &testutil.FakeNUMA{}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	s := New(p, nil)
	var keys []Key
	for i := range 8 {
		k := Key{Namespace: "ns", Hash: fmt.Sprint(i)}
		if _, err := s.Put(k, []SlotSize{{KSize: 1 << 20}}, func([]byte) error { return nil }); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	// Pin the first block of part 0 and the last of part 1.
	pinned, missing := s.Pin(keys)
	if len(pinned) != 8 || len(missing) != 0 {
		t.Fatalf("pin: %d pinned, %v missing", len(pinned), missing)
	}
	for i, b := range pinned {
		if b.NUMA() != i%2 {
			t.Fatalf("block %d on node %d, want %d (puts alternate between the parts)", i, b.NUMA(), i%2)
		}
		if i != 0 && i != 7 {
			s.Unpin([]*Block{b})
		}
	}
	for _, n := range []uint64{4 << 20, 5 << 20} {
		_, err := s.AllocExtent(n)
		if !errors.Is(err, ErrNoSpace) {
			t.Fatalf("AllocExtent(%d): %v, want ErrNoSpace", n, err)
		}
		if n > 4<<20 && !strings.Contains(err.Error(), "larger than a NUMA part") {
			t.Fatalf("AllocExtent(%d) larger than a part: %v, want it said", n, err)
		}
		if st := s.Stats(); st.Blocks != 8 || st.Evictions != 0 {
			t.Fatalf("after AllocExtent(%d): %d blocks, %d evictions; want 8 and 0", n, st.Blocks, st.Evictions)
		}
	}
	x, err := s.AllocExtent(3 << 20)
	if err != nil {
		t.Fatalf("AllocExtent(3 MiB): %v", err)
	}
	// LRU order 1..6 (0 is pinned): the prefix 1..5 is the shortest whose
	// eviction makes a 3 MiB run (1,3,5 on part 1); the evictor takes that
	// whole LRU prefix (TestEvictOnlyWhatIsNeeded), 2 and 4 included.
	if st := s.Stats(); st.Evictions != 5 {
		t.Fatalf("3 MiB evicted %d blocks, want the LRU prefix 1..5", st.Evictions)
	}
	s.ReleaseExtent(x)
}
