package store

import (
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
