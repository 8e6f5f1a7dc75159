package evict

// region is where Adaptive (or a shadow) keeps a block.
type region uint8

const (
	regionNone region = iota
	regionWindow
	// regionCandidate: moved out of the window by the last insert's
	// overflow, not yet judged against main's victim.
	regionCandidate
	regionProbation
	regionProtected
	regionFetched
	regions
)

// maxPending bounds the ids a lookup found missing and that a put is
// expected for (Adaptive.pending); past it they are dropped at once (a
// put not expected is counted as a lone access: a small bias, never a
// wrong order).
const maxPending = 1 << 16

// Adaptive is W-TinyLFU in Caffeine's shape, with its window chosen by
// shadow selection and its walk prefix-aware (issue 35):
//
//   - A put always succeeds: the block enters the window (an LRU).
//   - The window's overflow becomes a candidate for main. When room is
//     needed, the oldest candidate duels main's victim (probation's
//     least recent, then protected's): the more often accessed of the
//     two stays, ties to the victim, and the loser goes first. Admission
//     is thus a victim choice between two blocks, never a refused put.
//   - Main is segmented: a hit in probation promotes to protected (80 %
//     of main), whose overflow falls back to probation.
//   - Counts are exact per block id and halve every 10 × capacity
//     accesses (counts).
//   - The window's share follows the shadow (shadow.go) with the most
//     recent prefix hits: 1 % is TinyLFU-like, 100 % is plain LRU.
//   - Prefix-aware: a chain is touched tail first, so its head is the
//     most recent; the walk holds a parent back until its cached
//     children went (leafFirst); fetched copies, which another node
//     holds too, go before every own block.
//
// Capacity is the most blocks ever resident (the pool is sized in
// bytes; with one block size that is its capacity in blocks).
type Adaptive struct {
	lists    [regions]nlist
	freq     *counts
	sh       *shadows
	capacity int
	wCap     int // window blocks at the share followed
	pCap     int // protected blocks
	pending  map[uint64]struct{}
	clock    uint64   // stamps: each list move is a touch
	ids      []uint64 // Access's scratch
}

// NewAdaptive makes an empty adaptive policy.
func NewAdaptive() *Adaptive {
	a := &Adaptive{freq: newCounts(), sh: newShadows(), pending: make(map[uint64]struct{})}
	for i := range a.lists {
		a.lists[i].init()
	}
	return a
}

func (a *Adaptive) Name() string { return string(KindAdaptive) }

func (a *Adaptive) Len() int {
	n := 0
	for i := range a.lists {
		n += a.lists[i].n
	}
	return n
}

func (a *Adaptive) mainLen() int {
	return a.lists[regionProbation].n + a.lists[regionProtected].n
}

// share is the window share followed.
func (a *Adaptive) share() float64 { return a.sh.all[a.sh.best].share }

// Insert enters n in the window (a fetched copy in the fetched list);
// the window's overflow becomes candidates.
func (a *Adaptive) Insert(n, parent *Node, fetched bool) {
	n.link(parent, fetched)
	// Candidates join main unjudged only while it has room (the cache
	// filling, or main shrunk by removals); the others wait for a duel
	// however many puts come first: the daemon allocates a request's
	// blocks in one batch, all evictions before any insert.
	cands := &a.lists[regionCandidate]
	for c := cands.back(); c != nil && a.mainLen() < a.capacity-a.wCap; c = cands.back() {
		a.move(c, regionProbation)
	}
	if _, ok := a.pending[n.ID]; ok {
		delete(a.pending, n.ID) // counted and shadowed by its lookup
	} else {
		a.freq.add(n.ID)
		a.sh.lone(n.ID, a.freq)
	}
	if fetched {
		a.put(n, regionFetched)
	} else {
		a.put(n, regionWindow)
	}
	if l := a.Len(); l > a.capacity {
		a.capacity = l
		a.resize()
	}
	for w := &a.lists[regionWindow]; w.n > a.wCap; {
		a.move(w.back(), regionCandidate)
	}
}

func (a *Adaptive) resize() {
	a.wCap = windowCap(a.share(), a.capacity)
	a.pCap = protectedCap(a.share(), a.capacity)
	a.freq.period = max(minPeriod, countPeriod*a.capacity)
	a.sh.resize(a.capacity)
}

// Access counts a looked-up chain (ids: its keys' ids, found or not),
// runs it through the shadows, and touches the found blocks tail first.
// ids may be nil: then only found blocks are known.
func (a *Adaptive) Access(chain []*Node, ids []uint64) {
	if len(ids) != len(chain) {
		ids = a.ids[:0]
		for _, n := range chain {
			if n != nil {
				ids = append(ids, n.ID)
			}
		}
		a.ids = ids[:0]
	}
	for i, id := range ids {
		a.freq.add(id)
		if i < len(chain) && chain[i] == nil {
			if len(a.pending) >= maxPending {
				clear(a.pending)
			}
			a.pending[id] = struct{}{}
		}
	}
	if a.sh.request(ids, a.freq, a.capacity) {
		a.resize()
	}
	for i := len(chain) - 1; i >= 0; i-- {
		if n := chain[i]; n != nil && n.live && n.region != regionNone {
			a.touch(n)
		}
	}
}

// touch is a hit: the window and fetched lists are LRUs; a candidate or
// probation block is promoted to protected, whose overflow goes back.
func (a *Adaptive) touch(n *Node) {
	switch n.region {
	case regionWindow, regionFetched, regionProtected:
		a.move(n, n.region)
	default:
		a.move(n, regionProtected)
		if p := &a.lists[regionProtected]; p.n > a.pCap {
			a.move(p.back(), regionProbation)
		}
	}
}

// Remove forgets n. A main block removed while candidates wait is the
// loser of the oldest one's duel (Walk yielded it so): that candidate
// joins probation, as Caffeine's admitted candidate does.
func (a *Adaptive) Remove(n *Node) {
	if n.region == regionNone {
		return
	}
	r := n.region
	a.lists[r].remove(n)
	n.region = regionNone
	n.unlink()
	if r == regionProbation || r == regionProtected {
		if c := a.lists[regionCandidate].back(); c != nil {
			a.move(c, regionProbation)
		}
	}
}

func (a *Adaptive) put(n *Node, r region) {
	n.region = r
	a.clock++
	n.stamp = a.clock
	a.lists[r].pushFront(n)
}

func (a *Adaptive) move(n *Node, r region) {
	a.lists[n.region].remove(n)
	a.put(n, r)
}

// Walk yields blocks first victim first (order), each parent after its
// cached children (leafFirst). It changes nothing.
func (a *Adaptive) Walk(yield func(*Node) bool) { a.order(yield) }

// order is the eviction order the duels give, without moving anything:
// fetched copies (least recent first); then, while candidates wait, the
// loser of the oldest candidate against main's victim (probation, then
// protected, least recent first); without candidates, the less recent
// of main's victim and the window's (a window under its share, after a
// switch to a larger one, grows by recency: main's blocks are not all
// flushed before the window's oldest); then what is left: candidates
// not judged, those admitted in this walk, the window.
func (a *Adaptive) order(yield func(*Node) bool) {
	for n := a.lists[regionFetched].back(); n != nil; n = a.lists[regionFetched].older(n) {
		if !yield(n) {
			return
		}
	}
	cands, win := &a.lists[regionCandidate], &a.lists[regionWindow]
	c, w := cands.back(), win.back()
	var admitted []*Node // joined main's most recent end, in this walk
	m := mainIter{a: a}
	for v := m.first(); v != nil; {
		var out *Node
		switch {
		case c != nil && a.freq.get(c.ID) > a.freq.get(v.ID):
			admitted = append(admitted, c)
			out, c = v, cands.older(c)
		case c != nil:
			out, c = c, cands.older(c)
		case w != nil && w.stamp < v.stamp:
			out, w = w, win.older(w)
		default:
			out = v
		}
		if out == v {
			v = m.next(v)
		}
		if !yield(out) {
			return
		}
	}
	for ; c != nil; c = cands.older(c) {
		if !yield(c) {
			return
		}
	}
	for _, n := range admitted {
		if !yield(n) {
			return
		}
	}
	for ; w != nil; w = win.older(w) {
		if !yield(w) {
			return
		}
	}
}

// mainIter walks probation then protected, least recent first.
type mainIter struct{ a *Adaptive }

func (m mainIter) first() *Node {
	if n := m.a.lists[regionProbation].back(); n != nil {
		return n
	}
	return m.a.lists[regionProtected].back()
}

func (m mainIter) next(n *Node) *Node {
	if o := m.a.lists[n.region].older(n); o != nil {
		return o
	}
	if n.region == regionProbation {
		return m.a.lists[regionProtected].back()
	}
	return nil
}

// Stats reports the window share followed and how often it switched.
func (a *Adaptive) Stats() Stats {
	return Stats{Policy: a.Name(), Window: a.share(), Switches: a.sh.switches}
}
