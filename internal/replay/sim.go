package replay

import (
	"container/heap"
	"container/list"
	"math"
)

// Ratio is hits over accesses, counted in blocks.
type Ratio struct {
	Hits, Accesses uint64
}

// Value is the hit ratio (0 for no accesses).
func (r Ratio) Value() float64 {
	if r.Accesses == 0 {
		return 0
	}
	return float64(r.Hits) / float64(r.Accesses)
}

// Both simulators count accesses in request order, block by block: a block
// is a hit when it is cached at its access, and every accessed block is
// cached afterwards (a miss is inserted, evicting if full). Capacity is in
// blocks.

// LRU replays reqs through a least-recently-used cache of capacity blocks.
func LRU(reqs []Request, capacity int) Ratio {
	var r Ratio
	order := list.New() // front: most recent
	at := make(map[uint64]*list.Element, capacity+1)
	for _, req := range reqs {
		for _, h := range req.HashIDs {
			r.Accesses++
			if e, ok := at[h]; ok {
				r.Hits++
				order.MoveToFront(e)
				continue
			}
			if capacity <= 0 {
				continue
			}
			at[h] = order.PushFront(h)
			if order.Len() > capacity {
				old := order.Back()
				order.Remove(old)
				delete(at, old.Value.(uint64))
			}
		}
	}
	return r
}

// Belady replays reqs through Belady's offline optimum: when full, evict
// the cached block whose next access is farthest away (never, first). No
// policy that knows only the past can beat it, so it bounds the hit ratio a
// policy can reach at this capacity.
func Belady(reqs []Request, capacity int) Ratio {
	var seq []uint64
	for _, req := range reqs {
		seq = append(seq, req.HashIDs...)
	}
	// next[i]: index of the next access of seq[i]'s block, or never.
	const never = math.MaxInt
	next := make([]int, len(seq))
	last := make(map[uint64]int)
	for i := len(seq) - 1; i >= 0; i-- {
		n, ok := last[seq[i]]
		if !ok {
			n = never
		}
		next[i] = n
		last[seq[i]] = i
	}
	var r Ratio
	cached := make(map[uint64]int, capacity+1) // block -> its next access
	h := &farthest{}
	for i, b := range seq {
		r.Accesses++
		if _, ok := cached[b]; ok {
			r.Hits++
		}
		if capacity <= 0 {
			continue
		}
		// Stale heap entries (an older next access of a cached block) are
		// skipped when they surface: lazy deletion keeps each step O(log n).
		cached[b] = next[i]
		heap.Push(h, entry{block: b, next: next[i]})
		for len(cached) > capacity {
			e := heap.Pop(h).(entry)
			if n, ok := cached[e.block]; ok && n == e.next {
				delete(cached, e.block)
			}
		}
	}
	return r
}

type entry struct {
	block uint64
	next  int
}

// farthest is a max-heap on next access.
type farthest []entry

func (f farthest) Len() int           { return len(f) }
func (f farthest) Less(i, j int) bool { return f[i].next > f[j].next }
func (f farthest) Swap(i, j int)      { f[i], f[j] = f[j], f[i] }
func (f *farthest) Push(x any)        { *f = append(*f, x.(entry)) }
func (f *farthest) Pop() any {
	old := *f
	e := old[len(old)-1]
	*f = old[:len(old)-1]
	return e
}
