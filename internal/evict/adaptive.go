package evict

// region is the list Adaptive keeps a block in, or a shadow its record.
type region uint8

const (
	regionNone region = iota
	// W-TinyLFU's: a shadow's (shadow.go), and where Adaptive keeps an
	// own block that the shadow it follows holds there.
	regionWindow
	regionProbation
	regionProtected
	// Adaptive's alone.
	regionFetched // copies another node holds too: first to go
	regionOutcast // own blocks the followed shadow does not hold
	regions
)

// maxPending bounds the ids a lookup found missing and that a put is
// expected for (Adaptive.pending); past it they are dropped at once (a
// put not expected is counted as a lone access: a small bias, never a
// wrong order).
const maxPending = 1 << 16

// Adaptive is W-TinyLFU in Caffeine's shape with its window chosen by
// shadow selection, and its walk prefix-aware (issue 35):
//
//   - Six metadata-only shadows (shadow.go), each a W-TinyLFU at the
//     cache's capacity with a fixed window share (1 % to 100 %, which is
//     plain LRU), see every looked-up chain and share exact counts that
//     halve every 10 × capacity accesses. The real cache follows the one
//     with the most recent prefix hits.
//   - Following is mirroring: an own block that the followed shadow no
//     longer holds (its window victim lost the duel with main's victim,
//     or the other way round) is an outcast, and outcasts go first, the
//     longest cast out first. So a put always succeeds, and admission
//     is only a victim choice: a block the shadow did not admit goes
//     before the ones it keeps. The blocks the shadow keeps sit in its
//     regions (window, probation, protected), moved as it moves their
//     ids, and go in the order it would drop them (order); a switch of
//     shadow recasts every block at once (follow).
//   - A lookup's last block, when it was missing and is put, enters as
//     the first of the outcasts: in a request it is mostly the partial
//     block, almost never reused (issue 35's notes).
//   - Prefix-aware: a chain is touched tail first, so its head is the
//     most recent, and the walk holds a parent back until its cached
//     children went (leafFirst); fetched copies, which another node
//     holds too, go before every own block.
//
// Capacity is the most blocks ever resident (the pool is sized in
// bytes; with one block size that is its capacity in blocks).
type Adaptive struct {
	lists    [regions]nlist
	at       map[uint64]*Node // own blocks, by id
	freq     *counts
	sh       *shadows
	capacity int
	pending  map[uint64]bool // ids looked up missing; true: a chain's last
	ids      []uint64        // Access's scratch
	recast   []*Node         // follow's scratch
}

// NewAdaptive makes an empty adaptive policy.
func NewAdaptive() *Adaptive {
	a := &Adaptive{at: make(map[uint64]*Node), freq: newCounts(), pending: make(map[uint64]bool)}
	a.sh = newShadows(a.held)
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

// share is the window share of the shadow followed.
func (a *Adaptive) share() float64 { return a.sh.followed().share }

// Insert lists n: a fetched copy with the fetched, an own block in the
// region where the followed shadow holds its id, or with the outcasts
// (its lookup ran it through the shadows already; a put without one is
// run through them now). The capacity grows first, so that a filling
// cache's shadows do not drop what the real one still has room for.
func (a *Adaptive) Insert(n, parent *Node, fetched bool) {
	n.link(parent, fetched)
	if l := a.Len() + 1; l > a.capacity {
		a.capacity = l
		a.resize()
	}
	if fetched {
		a.put(n, regionFetched)
	} else {
		last, looked := a.pending[n.ID]
		if looked {
			delete(a.pending, n.ID)
		} else {
			a.freq.add(n.ID)
			a.sh.lone(n.ID, a.freq)
		}
		a.at[n.ID] = n
		switch e := a.sh.followed().at[n.ID]; {
		case last:
			a.lists[regionOutcast].pushBack(n)
			n.region = regionOutcast
		case e != nil:
			a.put(n, e.reg)
		default:
			a.put(n, regionOutcast)
		}
	}
}

func (a *Adaptive) resize() {
	a.freq.period = max(minPeriod, countPeriod*a.capacity)
	a.sh.resize(a.capacity)
}

// Access counts a looked-up chain (ids: its keys' ids, found or not),
// runs it through the shadows, and touches the found blocks tail first.
// ids may be nil: then only found blocks are known.
func (a *Adaptive) Access(chain []*Node, ids []uint64) {
	known := len(ids) == len(chain) // else ids are the found blocks'
	if !known {
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
		if known && chain[i] == nil {
			if len(a.pending) >= maxPending {
				clear(a.pending)
			}
			a.pending[id] = i == len(ids)-1
		}
	}
	if a.sh.request(ids, a.freq, a.capacity) {
		a.follow()
	}
	for i := len(chain) - 1; i >= 0; i-- {
		if n := chain[i]; n != nil && n.live && n.region != regionNone {
			a.move(n, n.region)
		}
	}
}

// held is the followed shadow's word that id moved to the front of r
// (regionNone: out of it): an own block of that id moves as well.
func (a *Adaptive) held(id uint64, r region) {
	n := a.at[id]
	if n == nil {
		return
	}
	if r == regionNone {
		r = regionOutcast
	}
	a.move(n, r)
}

// follow recasts every own block after a switch of shadow: each kept
// one joins the outcasts (the newest, in its order), then each that the
// new shadow holds moves to its region there, in the shadow's order. It
// is O(blocks), and switches are at least minSwitchGap requests apart.
func (a *Adaptive) follow() {
	rc := a.recast[:0]
	for _, r := range []region{regionWindow, regionProbation, regionProtected} {
		for n := a.lists[r].back(); n != nil; n = a.lists[r].older(n) {
			rc = append(rc, n)
		}
	}
	for _, n := range rc {
		a.move(n, regionOutcast)
	}
	clear(rc)
	a.recast = rc[:0]
	sh := a.sh.followed()
	for _, l := range []*slist{&sh.prot, &sh.prob, &sh.win} {
		for e := l.back(); e != nil; e = l.older(e) {
			if n := a.at[e.id]; n != nil {
				a.move(n, e.reg)
			}
		}
	}
}

// Remove forgets n.
func (a *Adaptive) Remove(n *Node) {
	if n.region == regionNone {
		return
	}
	a.lists[n.region].remove(n)
	if a.at[n.ID] == n {
		delete(a.at, n.ID)
	}
	n.region = regionNone
	n.unlink()
}

func (a *Adaptive) put(n *Node, r region) {
	n.region = r
	a.lists[r].pushFront(n)
}

func (a *Adaptive) move(n *Node, r region) {
	a.lists[n.region].remove(n)
	a.put(n, r)
}

// Walk yields blocks first victim first: fetched copies, then outcasts,
// each least recent first; then the blocks the followed shadow holds in
// the order it would drop them (the window's oldest duels main's victim,
// probation then protected, least recent first: the less often accessed
// goes, ties to the window's); and each parent after its cached
// children (leafFirst). It changes nothing and must not be called back
// into from yield.
func (a *Adaptive) Walk(yield func(*Node) bool) { leafFirst(a.order, yield) }

func (a *Adaptive) order(yield func(*Node) bool) {
	for _, r := range []region{regionFetched, regionOutcast} {
		l := &a.lists[r]
		for n := l.back(); n != nil; n = l.older(n) {
			if !yield(n) {
				return
			}
		}
	}
	win := &a.lists[regionWindow]
	w, m := win.back(), mainIter{a: a}
	for v := m.first(); w != nil || v != nil; {
		out := v
		if v == nil || (w != nil && a.freq.get(w.ID) <= a.freq.get(v.ID)) {
			out, w = w, win.older(w)
		} else {
			v = m.next(v)
		}
		if !yield(out) {
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
