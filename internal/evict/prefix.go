package evict

import "math"

// rank orders blocks for eviction, lowest first: fetched copies (class 0)
// before own blocks (class 1), then by score, then by seq (a parent
// bumped to its child's score ranks just above it).
type rank struct {
	class uint8
	score float64
	seq   uint64
}

func (a rank) less(b rank) bool {
	if a.class != b.class {
		return a.class < b.class
	}
	if a.score != b.score {
		return a.score < b.score
	}
	return a.seq < b.seq
}

// Climber defaults (see Prefix.climb). The sample is a few times the
// resident blocks: short enough to follow a trace, long enough that one
// request's luck does not steer.
const (
	sampleFactor = 3    // accesses per sample, × resident blocks
	firstWeight  = 1.0  // frequency weight at start, × resident blocks
	maxWeight    = 8.0  // frequency weight bound, × resident blocks
	firstStep    = 0.1  // first step, × resident blocks
	stepDecay    = 0.98 // the step shrinks each sample...
	minStep      = 0.01 // ...down to this
	minSample    = 1024
	// The sketch has at least sketchWidth counters per row and grows
	// to sketchPerBlock × resident blocks: narrower, its collisions
	// swamp the counts (on the trace, 1<<14 lost 0.02–0.05 at every
	// size); much wider measured no better.
	sketchWidth    = 1 << 16
	sketchPerBlock = 4
)

// Prefix is the chain-aware adaptive policy (package comment). A block's
// score is the access clock at its last touch plus weight × resident
// blocks × log2(its sketch frequency, this access counted): weight 0 is
// recency alone (LRU over chains), a large weight is mostly frequency,
// and a block seen once gets no credit. A chain's blocks are touched
// tail first, head last, and a parent is bumped above a child that
// outranks it, so every parent ranks above its cached children.
//
// On the Mooncake trace (docs/tiering.md) a fixed weight of 1 beat 0 at
// every size, and the climber, started at 1 with small steps, stayed
// within ±0.004 of the best fixed weight; started at 0 with large steps
// it fell below LRU. log2(f) beat log2(1+f), √f and f; aging the
// sketch faster did not help.
type Prefix struct {
	heap  []*Node
	clock float64
	seq   uint64
	freq  *sketch

	// Hill climbing (climb): weight (× resident blocks) moves by step
	// each sample; the step turns when the sample's prefix hit ratio fell
	// below the last one's.
	weight, step    float64
	hits, accesses  int
	prevRatio       float64
	samples, rounds uint64
	fixed           bool // tests: no climbing
	sampleFactor    int  // accesses per sample, × resident blocks
}

// NewPrefix makes an empty prefix-aware policy.
func NewPrefix() *Prefix {
	return &Prefix{freq: newSketch(sketchWidth), weight: firstWeight, step: firstStep, sampleFactor: sampleFactor}
}

func (p *Prefix) Name() string { return string(KindPrefix) }
func (p *Prefix) Len() int     { return len(p.heap) }

// Insert ranks a new block like a touch, its frequency counted too, and
// bumps its ancestors above it.
func (p *Prefix) Insert(n, parent *Node, fetched bool) {
	n.link(parent, fetched)
	n.idx = len(p.heap)
	p.heap = append(p.heap, n)
	if w := sketchPerBlock * len(p.heap); w > int(p.freq.mask)+1 {
		p.freq.grow(w)
	}
	p.touch(n)
	p.accesses++
	p.maybeClimb()
}

// Access touches the found blocks of a chain (nil: missing) tail first,
// so the head ends most recent, and counts the chain's prefix hits for
// the climber. Prefix needs no ids.
func (p *Prefix) Access(chain []*Node, _ []uint64) {
	hit := 0
	for hit < len(chain) && chain[hit] != nil {
		hit++
	}
	for i := len(chain) - 1; i >= 0; i-- {
		if n := chain[i]; n != nil && n.live && n.idx >= 0 {
			p.touch(n)
		}
	}
	p.hits += hit
	p.accesses += len(chain)
	p.maybeClimb()
}

// Remove forgets n.
func (p *Prefix) Remove(n *Node) {
	if !n.live || n.idx < 0 {
		return
	}
	i := n.idx
	last := len(p.heap) - 1
	if i != last {
		p.swap(i, last)
	}
	p.heap[last] = nil
	p.heap = p.heap[:last]
	if i != last {
		p.fix(i)
	}
	n.idx = -1
	n.unlink()
}

// touch gives n its rank for an access now and bumps its ancestors.
func (p *Prefix) touch(n *Node) {
	p.clock++
	f := p.freq.add(n.ID)
	r := rank{class: 1, score: p.clock + p.weight*float64(len(p.heap))*math.Log2(float64(f)), seq: p.nextSeq()}
	if n.fetched && n.kids == 0 {
		r.class = 0 // a fetched parent of own blocks ranks with them
	}
	n.rank = r
	p.fix(n.idx)
	p.bump(n)
}

// bump raises n's ancestors that do not rank above it: a head never goes
// before its tail.
func (p *Prefix) bump(n *Node) {
	for a := n.liveParent(); a != nil && a.idx >= 0; a = a.liveParent() {
		if n.rank.less(a.rank) {
			return
		}
		a.rank = rank{class: max(a.rank.class, n.rank.class), score: n.rank.score, seq: p.nextSeq()}
		p.fix(a.idx)
		n = a
	}
}

func (p *Prefix) nextSeq() uint64 { p.seq++; return p.seq }

// maybeClimb ends a sample when it is long enough and moves the weight.
func (p *Prefix) maybeClimb() {
	if p.fixed || p.accesses < max(minSample, p.sampleFactor*len(p.heap)) {
		return
	}
	ratio := float64(p.hits) / float64(p.accesses)
	p.climb(ratio)
	p.hits, p.accesses = 0, 0
}

// climb is one hill-climbing move: keep going while the hit ratio
// rises, turn back when it falls; the step decays so the weight settles,
// and the weight stays in [0, maxWeight].
func (p *Prefix) climb(ratio float64) {
	if p.samples > 0 && ratio < p.prevRatio {
		p.step = -p.step
		p.rounds++
	}
	p.samples++
	p.prevRatio = ratio
	p.step *= stepDecay
	if math.Abs(p.step) < minStep {
		p.step = math.Copysign(minStep, p.step)
	}
	p.weight = min(max(p.weight+p.step, 0), maxWeight)
}

// Walk yields blocks lowest rank first, except that a block waits until
// every live child of it was yielded (ranks keep parents above children
// as touches go, but a parent's own touch, a moved weight or a sketch
// estimate can put it below a child; the walk holds the rule anyway).
// It changes nothing and stops when yield says so. It must not be
// called back into from yield.
func (p *Prefix) Walk(yield func(*Node) bool) { leafFirst(p.inRankOrder, yield) }

// inRankOrder yields the heap's nodes lowest rank first: a side heap of
// the frontier, O(k log k) for k nodes yielded.
func (p *Prefix) inRankOrder(yield func(*Node) bool) {
	if len(p.heap) == 0 {
		return
	}
	front := []int{0}
	for len(front) > 0 {
		i := front[0]
		last := len(front) - 1
		front[0] = front[last]
		front = front[:last]
		p.siftFront(front)
		if !yield(p.heap[i]) {
			return
		}
		for _, c := range []int{2*i + 1, 2*i + 2} {
			if c < len(p.heap) {
				front = append(front, c)
				p.upFront(front, len(front)-1)
			}
		}
	}
}

// Stats reports the climber's state.
func (p *Prefix) Stats() Stats {
	return Stats{Policy: p.Name(), Weight: p.weight, Samples: p.samples, Turns: p.rounds}
}

// Heap of nodes by rank, each node knowing its index.

func (p *Prefix) less(i, j int) bool { return p.heap[i].rank.less(p.heap[j].rank) }

func (p *Prefix) swap(i, j int) {
	p.heap[i], p.heap[j] = p.heap[j], p.heap[i]
	p.heap[i].idx, p.heap[j].idx = i, j
}

func (p *Prefix) fix(i int) {
	if !p.down(i) {
		p.up(i)
	}
}

func (p *Prefix) up(i int) {
	for i > 0 {
		par := (i - 1) / 2
		if !p.less(i, par) {
			return
		}
		p.swap(i, par)
		i = par
	}
}

func (p *Prefix) down(i int) bool {
	start, n := i, len(p.heap)
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if r := c + 1; r < n && p.less(r, c) {
			c = r
		}
		if !p.less(c, i) {
			break
		}
		p.swap(i, c)
		i = c
	}
	return i > start
}

// The frontier of Walk: a min-heap of heap indexes by their nodes' rank.

func (p *Prefix) frontLess(f []int, a, b int) bool { return p.heap[f[a]].rank.less(p.heap[f[b]].rank) }

func (p *Prefix) upFront(f []int, i int) {
	for i > 0 {
		par := (i - 1) / 2
		if !p.frontLess(f, i, par) {
			return
		}
		f[i], f[par] = f[par], f[i]
		i = par
	}
}

func (p *Prefix) siftFront(f []int) {
	i := 0
	for {
		c := 2*i + 1
		if c >= len(f) {
			return
		}
		if r := c + 1; r < len(f) && p.frontLess(f, r, c) {
			c = r
		}
		if !p.frontLess(f, c, i) {
			return
		}
		f[i], f[c] = f[c], f[i]
		i = c
	}
}
