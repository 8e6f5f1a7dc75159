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

// Shares are the cache sizes every replay is measured at, in percent of
// a trace's unique blocks (issue 35).
var Shares = []int{2, 5, 10, 20}

// CapacityAt is percent % of unique blocks, rounded to the nearest block
// (the table is at these capacities).
func CapacityAt(unique, percent int) int { return (unique*percent + 50) / 100 }

// Sim is a cache simulator over block ids, capacity in blocks. Run drives
// it with prefix-hit accounting.
type Sim interface {
	// Has reports whether id is cached, changing nothing.
	Has(id uint64) bool
	// Access is one reference to id: a hit updates the policy's state, a
	// miss inserts id (evicting when full).
	Access(id uint64)
}

// Run replays reqs through s as the issue-35 rivals are measured: per
// request, the longest prefix of its hash_ids that s holds counts as
// hits (all its blocks are requested); then every id of the request is
// accessed, in order.
func Run(reqs []Request, s Sim) Ratio {
	var r Ratio
	for _, req := range reqs {
		n := 0
		for n < len(req.HashIDs) && s.Has(req.HashIDs[n]) {
			n++
		}
		r.Hits += uint64(n)
		r.Accesses += uint64(len(req.HashIDs))
		for _, h := range req.HashIDs {
			s.Access(h)
		}
	}
	return r
}

// LRU replays reqs through a least-recently-used cache of capacity blocks.
func LRU(reqs []Request, capacity int) Ratio { return Run(reqs, NewLRUSim(capacity)) }

// Belady replays reqs through Belady's offline optimum (NewBeladySim).
func Belady(reqs []Request, capacity int) Ratio { return Run(reqs, NewBeladySim(reqs, capacity)) }

// WTinyLFU replays reqs through the fixed W-TinyLFU rival (NewWTinyLFUSim).
func WTinyLFU(reqs []Request, capacity int) Ratio { return Run(reqs, NewWTinyLFUSim(capacity)) }

// S3FIFO replays reqs through the fixed S3-FIFO rival (NewS3FIFOSim).
func S3FIFO(reqs []Request, capacity int) Ratio { return Run(reqs, NewS3FIFOSim(capacity)) }

// lruList is an LRU of ids: front most recent.
type lruList struct {
	order *list.List
	at    map[uint64]*list.Element
}

func newLRUList() lruList { return lruList{order: list.New(), at: map[uint64]*list.Element{}} }

func (l lruList) has(id uint64) bool { _, ok := l.at[id]; return ok }
func (l lruList) len() int           { return l.order.Len() }
func (l lruList) push(id uint64)     { l.at[id] = l.order.PushFront(id) }
func (l lruList) touch(id uint64)    { l.order.MoveToFront(l.at[id]) }
func (l lruList) oldest() uint64     { return l.order.Back().Value.(uint64) }
func (l lruList) remove(id uint64)   { l.order.Remove(l.at[id]); delete(l.at, id) }

// pop removes and returns the least recently used id.
func (l lruList) pop() uint64 { id := l.oldest(); l.remove(id); return id }

// LRUSim is a plain LRU.
type LRUSim struct {
	cap int
	l   lruList
}

// NewLRUSim makes an empty LRU of capacity blocks.
func NewLRUSim(capacity int) *LRUSim { return &LRUSim{cap: capacity, l: newLRUList()} }

func (s *LRUSim) Has(id uint64) bool { return s.l.has(id) }

func (s *LRUSim) Access(id uint64) {
	if s.l.has(id) {
		s.l.touch(id)
		return
	}
	if s.cap <= 0 {
		return
	}
	s.l.push(id)
	if s.l.len() > s.cap {
		s.l.pop()
	}
}

// BeladySim is Belady's offline optimum: when full, evict the cached
// block whose next access is farthest away (never, first). No policy
// that knows only the past can beat it, so it bounds the hit ratio a
// policy can reach at this capacity. It must be driven with exactly the
// accesses of the reqs it was made from, in order (Run does).
type BeladySim struct {
	cap    int
	next   []int // next[i]: index of the next access of access i's block
	i      int
	cached map[uint64]int // block -> its next access
	h      farthest
}

const never = math.MaxInt

// NewBeladySim makes Belady's cache of capacity blocks for reqs.
func NewBeladySim(reqs []Request, capacity int) *BeladySim {
	var seq []uint64
	for _, req := range reqs {
		seq = append(seq, req.HashIDs...)
	}
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
	return &BeladySim{cap: capacity, next: next, cached: make(map[uint64]int, capacity+1)}
}

func (s *BeladySim) Has(id uint64) bool { _, ok := s.cached[id]; return ok }

func (s *BeladySim) Access(id uint64) {
	nx := s.next[s.i]
	s.i++
	if s.cap <= 0 {
		return
	}
	// Stale heap entries (an older next access of a cached block) are
	// skipped when they surface: lazy deletion keeps each step O(log n).
	s.cached[id] = nx
	heap.Push(&s.h, entry{block: id, next: nx})
	for len(s.cached) > s.cap {
		e := heap.Pop(&s.h).(entry)
		if n, ok := s.cached[e.block]; ok && n == e.next {
			delete(s.cached, e.block)
		}
	}
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
