package evict

// Simulated is what Simulate asks of a policy: the store's side of the
// policy interface (store.Policy, restated: store imports this package).
type Simulated interface {
	Insert(n, parent *Node, fetched bool)
	Access(chain []*Node, ids []uint64)
	Remove(n *Node)
	Walk(yield func(*Node) bool)
	Len() int
}

// Simulate replays chains (each request's block ids, in chain order) as
// the daemon sees them (internal/replay.Drive) through p, holding at most
// capacity blocks: each request looks its chain up (Access), counts its
// longest cached prefix as hits, then inserts the blocks after it that
// are missing, evicting p's first victim while capacity blocks are held.
// It is the in-process figure that `make replay` and the trace tests
// print beside the daemon's; it never touches a store.
func Simulate(chains [][]uint64, capacity int, p Simulated) (hits, accesses uint64) {
	at := make(map[uint64]*Node)
	for _, ids := range chains {
		chain := make([]*Node, len(ids))
		hit := -1
		for i, h := range ids {
			chain[i] = at[h]
			if chain[i] == nil && hit < 0 {
				hit = i
			}
		}
		if hit < 0 {
			hit = len(chain)
		}
		hits += uint64(hit)
		accesses += uint64(len(chain))
		p.Access(chain, ids)
		// The daemon allocates the request's missing blocks in one batch
		// (AllocBatch), evicting for each, and indexes them all at commit:
		// all the evictions come before any insert.
		var put []int
		for i := hit; i < len(chain); i++ {
			if at[ids[i]] == nil {
				put = append(put, i)
			}
		}
		for p.Len() > 0 && p.Len()+len(put) > capacity {
			var v *Node
			p.Walk(func(n *Node) bool { v = n; return false })
			p.Remove(v)
			delete(at, v.ID)
		}
		for _, i := range put[max(0, len(put)-capacity):] {
			n := &Node{ID: ids[i]}
			var parent *Node
			if i > 0 {
				parent = at[ids[i-1]]
			}
			p.Insert(n, parent, false)
			at[ids[i]] = n
		}
	}
	return hits, accesses
}
