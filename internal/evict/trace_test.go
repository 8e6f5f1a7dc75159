package evict

import (
	"testing"

	"github.com/pegaflow/pegad/internal/replay"
)

// policy is what the store asks of a policy (store.Policy, restated here:
// store imports this package).
type policy interface {
	Insert(n, parent *Node, fetched bool)
	Access(chain []*Node)
	Remove(n *Node)
	Walk(yield func(*Node) bool)
	Len() int
}

// simulate replays reqs as the daemon sees them (internal/replay.Drive):
// each request looks its chain up (Access), counts its longest cached
// prefix, then inserts the blocks after it that are missing, evicting the
// policy's first victim while capacity blocks are held.
func simulate(t testing.TB, reqs []replay.Request, capacity int, p policy) replay.Ratio {
	t.Helper()
	var r replay.Ratio
	at := make(map[uint64]*Node)
	for _, req := range reqs {
		chain := make([]*Node, len(req.HashIDs))
		hit := -1
		for i, h := range req.HashIDs {
			chain[i] = at[h]
			if chain[i] == nil && hit < 0 {
				hit = i
			}
		}
		if hit < 0 {
			hit = len(chain)
		}
		r.Hits += uint64(hit)
		r.Accesses += uint64(len(chain))
		p.Access(chain)
		for i := hit; i < len(chain); i++ {
			h := req.HashIDs[i]
			if at[h] != nil {
				continue
			}
			for p.Len() >= capacity {
				var v *Node
				p.Walk(func(n *Node) bool { v = n; return false })
				p.Remove(v)
				delete(at, v.ID)
			}
			n := &Node{ID: h}
			var parent *Node
			if i > 0 {
				parent = at[req.HashIDs[i-1]]
			}
			p.Insert(n, parent, false)
			at[h] = n
		}
	}
	return r
}

func loadTrace(t testing.TB) []replay.Request {
	t.Helper()
	reqs, err := replay.ReadTraceFile("../replay/testdata/mooncake_fast25_synthetic_trace.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// TestTracePrefixAtLeastLRU replays the Mooncake FAST'25 trace at 2, 5,
// 10 and 20 % of its blocks: the prefix policy's prefix hit ratio must
// be at least LRU's at every size.
func TestTracePrefixAtLeastLRU(t *testing.T) {
	if testing.Short() {
		t.Skip("trace replay")
	}
	reqs := loadTrace(t)
	_, unique := replay.Stats(reqs)
	for _, share := range []int{2, 5, 10, 20} {
		capacity := unique * share / 100
		lru := simulate(t, reqs, capacity, NewLRU()).Value()
		pre := simulate(t, reqs, capacity, NewPrefix()).Value()
		bel := replay.Belady(reqs, capacity).Value()
		t.Logf("%2d %%: %5d blocks  lru %.3f  prefix %.3f  belady %.3f", share, capacity, lru, pre, bel)
		if pre < lru {
			t.Errorf("%d %%: prefix %.4f below LRU %.4f", share, pre, lru)
		}
	}
}
