package evict

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// newFixedPrefix is a Prefix that does not climb, at weight w.
func newFixedPrefix(w float64) *Prefix {
	p := NewPrefix()
	p.fixed, p.weight = true, w
	return p
}

// order is Walk's order, by node ID.
func order(p Simulated) []uint64 {
	var ids []uint64
	p.Walk(func(n *Node) bool { ids = append(ids, n.ID); return true })
	return ids
}

// op is one step of a policy script: insert id (after parent, 0: none;
// fetched), access a chain of ids (0: missing), or remove id.
type op struct {
	insert, parent uint64
	fetched        bool
	access         []uint64
	remove         uint64
}

func TestWalkOrder(t *testing.T) {
	cases := []struct {
		name   string
		policy func() Simulated
		ops    []op
		want   []uint64 // first victim first
	}{
		{"lru: oldest first", func() Simulated { return NewLRU() },
			[]op{{insert: 1}, {insert: 2}, {insert: 3}}, []uint64{1, 2, 3}},
		{"lru: access moves to the end", func() Simulated { return NewLRU() },
			[]op{{insert: 1}, {insert: 2}, {insert: 3}, {access: []uint64{1, 0}}}, []uint64{2, 3, 1}},
		{"lru: fetched first", func() Simulated { return NewLRU() },
			[]op{{insert: 1}, {insert: 2}, {insert: 3, fetched: true}}, []uint64{3, 1, 2}},
		{"lru: remove", func() Simulated { return NewLRU() },
			[]op{{insert: 1}, {insert: 2}, {insert: 3}, {remove: 2}}, []uint64{1, 3}},
		{"prefix: chain tail first", func() Simulated { return newFixedPrefix(0) },
			[]op{{insert: 1}, {insert: 2, parent: 1}, {insert: 3, parent: 2}}, []uint64{3, 2, 1}},
		{"prefix: chain accessed stays tail first", func() Simulated { return newFixedPrefix(0) },
			[]op{{insert: 1}, {insert: 2, parent: 1}, {insert: 3, parent: 2}, {insert: 9}, {access: []uint64{1, 2, 3}}},
			[]uint64{9, 3, 2, 1}},
		{"prefix: a parent ranks above its newest child", func() Simulated { return newFixedPrefix(0) },
			[]op{{insert: 1}, {insert: 9}, {insert: 2, parent: 1}}, []uint64{9, 2, 1}},
		{"prefix: fetched first, even newest", func() Simulated { return newFixedPrefix(0) },
			[]op{{insert: 1}, {insert: 2}, {insert: 3, fetched: true}}, []uint64{3, 1, 2}},
		{"prefix: fetched parent of an own child is kept with it", func() Simulated { return newFixedPrefix(0) },
			[]op{{insert: 1, fetched: true}, {insert: 5, fetched: true}, {insert: 2, parent: 1}}, []uint64{5, 2, 1}},
		{"prefix: frequent block outlives newer ones", func() Simulated { return newFixedPrefix(10) },
			[]op{{insert: 1}, {access: []uint64{1}}, {access: []uint64{1}}, {access: []uint64{1}}, {insert: 2}, {insert: 3}},
			[]uint64{2, 3, 1}},
		{"prefix: weight 0 is recency alone", func() Simulated { return newFixedPrefix(0) },
			[]op{{insert: 1}, {access: []uint64{1}}, {access: []uint64{1}}, {access: []uint64{1}}, {insert: 2}, {insert: 3}},
			[]uint64{1, 2, 3}},
		{"prefix: removed parent leaves its child alone", func() Simulated { return newFixedPrefix(0) },
			[]op{{insert: 1}, {insert: 2, parent: 1}, {remove: 1}, {insert: 3}}, []uint64{2, 3}},
		{"adaptive: chain tail first", func() Simulated { return NewAdaptive() },
			[]op{{insert: 1}, {insert: 2, parent: 1}, {insert: 3, parent: 2}, {insert: 9}}, []uint64{9, 3, 2, 1}},
		{"adaptive: chain accessed stays tail first", func() Simulated { return NewAdaptive() },
			[]op{{insert: 1}, {insert: 2, parent: 1}, {insert: 3, parent: 2}, {insert: 9}, {access: []uint64{1, 2, 3}}},
			[]uint64{9, 3, 2, 1}},
		{"adaptive: fetched first, even newest", func() Simulated { return NewAdaptive() },
			// 2 is the window's, 1 main's victim: a tie, lost by the window's
			[]op{{insert: 1}, {insert: 2}, {insert: 3, fetched: true}}, []uint64{3, 2, 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := c.policy()
			nodes := map[uint64]*Node{}
			for _, o := range c.ops {
				switch {
				case o.insert != 0:
					n := &Node{ID: o.insert}
					nodes[o.insert] = n
					p.Insert(n, nodes[o.parent], o.fetched)
				case o.access != nil:
					chain := make([]*Node, len(o.access))
					for i, id := range o.access {
						chain[i] = nodes[id]
					}
					p.Access(chain, nil)
				default:
					p.Remove(nodes[o.remove])
					delete(nodes, o.remove)
				}
			}
			if got := order(p); !slices.Equal(got, c.want) {
				t.Fatalf("walk %v, want %v", got, c.want)
			}
			if p.Len() != len(c.want) {
				t.Fatalf("len %d, want %d", p.Len(), len(c.want))
			}
		})
	}
}

// TestPrefixInvariants drives the prefix policy (climbing) with random
// chains, accesses and removals, and checks after each step that Walk
// yields every node once, each after all its live children, and that
// kids counts match.
func TestPrefixInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	p := NewPrefix()
	p.sampleFactor = 1
	var live []*Node
	next := uint64(1)
	for step := 0; step < 3000; step++ {
		switch r := rng.IntN(10); {
		case r < 5 || len(live) == 0: // a chain of 1..4 new blocks, maybe under a live one
			var parent *Node
			if len(live) > 0 && rng.IntN(2) == 0 {
				parent = live[rng.IntN(len(live))]
			}
			for range 1 + rng.IntN(4) {
				n := &Node{ID: next}
				next++
				p.Insert(n, parent, rng.IntN(8) == 0)
				live = append(live, n)
				parent = n
			}
		case r < 8: // access a node's chain, head first, with a miss at the end
			var chain []*Node
			for n := live[rng.IntN(len(live))]; n != nil; n = n.Parent() {
				chain = append(chain, n)
			}
			slices.Reverse(chain)
			p.Access(append(chain, nil), nil)
		default: // evict the first victim, or remove any block
			var v *Node
			if rng.IntN(2) == 0 {
				p.Walk(func(n *Node) bool { v = n; return false })
			} else {
				v = live[rng.IntN(len(live))]
			}
			p.Remove(v)
			live = slices.DeleteFunc(live, func(n *Node) bool { return n == v })
		}
		checkPrefix(t, p, live)
		if t.Failed() {
			t.Fatalf("step %d", step)
		}
	}
	if p.Stats().Samples == 0 {
		t.Fatalf("the climber judged no sample")
	}
}

func checkPrefix(t *testing.T, p Simulated, live []*Node) {
	t.Helper()
	pos := map[*Node]int{}
	p.Walk(func(n *Node) bool {
		if _, dup := pos[n]; dup {
			t.Errorf("node %d yielded twice", n.ID)
		}
		pos[n] = len(pos)
		return true
	})
	if len(pos) != len(live) || p.Len() != len(live) {
		t.Errorf("walk %d nodes, len %d, want %d", len(pos), p.Len(), len(live))
	}
	kids := map[*Node]int{}
	for _, n := range live {
		par := n.Parent()
		if par == nil {
			continue
		}
		kids[par]++
		if pos[par] < pos[n] {
			t.Errorf("parent %d before its child %d", par.ID, n.ID)
		}
	}
	for _, n := range live {
		if n.kids != kids[n] {
			t.Errorf("node %d: kids %d, want %d", n.ID, n.kids, kids[n])
		}
	}
}

// TestWalkRankOrder: blocks without chains are yielded in rank order,
// and a walk stopped early yields a prefix of it.
func TestWalkRankOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	p := newFixedPrefix(0)
	for id := uint64(1); id <= 500; id++ {
		p.Insert(&Node{ID: id}, nil, rng.IntN(5) == 0)
	}
	for range 300 {
		n := p.heap[rng.IntN(len(p.heap))]
		p.Access([]*Node{n}, nil)
	}
	var got []*Node
	p.Walk(func(n *Node) bool { got = append(got, n); return true })
	want := slices.Clone(p.heap)
	slices.SortFunc(want, func(a, b *Node) int {
		if a.rank.less(b.rank) {
			return -1
		}
		return 1
	})
	if !slices.Equal(got, want) {
		t.Fatalf("walk is not rank order")
	}
	var first []*Node
	p.Walk(func(n *Node) bool { first = append(first, n); return len(first) < 7 })
	if !slices.Equal(first, want[:7]) {
		t.Fatalf("stopped walk: %d nodes, not the first 7", len(first))
	}
}

func TestClimb(t *testing.T) {
	cases := []struct {
		name   string
		ratios []float64
		// want: the weight's direction of travel after the last ratio
		// (+1 up, -1 down) and whether it turned at all.
		wantUp    bool
		wantTurns uint64
	}{
		{"rising keeps going", []float64{0.1, 0.2, 0.3}, true, 0},
		{"a fall turns back", []float64{0.3, 0.2}, false, 1},
		{"a fall then a rise keeps the new way", []float64{0.3, 0.2, 0.25}, false, 1},
		{"two falls turn twice", []float64{0.3, 0.2, 0.1}, true, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := NewPrefix()
			for _, r := range c.ratios {
				p.climb(r)
			}
			if up := p.step > 0; up != c.wantUp || p.rounds != c.wantTurns {
				t.Fatalf("step %v (up %v), turns %d; want up %v, turns %d", p.step, up, p.rounds, c.wantUp, c.wantTurns)
			}
		})
	}
	t.Run("bounded", func(t *testing.T) {
		p := NewPrefix()
		for i := range 2000 {
			p.climb(float64(i)) // always rising: up to the bound
		}
		if p.weight != maxWeight {
			t.Fatalf("weight %v, want the bound %v", p.weight, maxWeight)
		}
		for i := range 4000 {
			p.climb(float64(-i)) // always falling: turns every time, mean 0 move
		}
		if p.weight < 0 || p.weight > maxWeight {
			t.Fatalf("weight %v out of [0, %v]", p.weight, maxWeight)
		}
	})
}

func TestSketch(t *testing.T) {
	s := newSketch(1024)
	for i := 1; i <= 5; i++ {
		if got := s.add(42); got < i {
			t.Fatalf("after %d adds estimate %d", i, got)
		}
	}
	if got := s.estimate(7); got > 1 {
		t.Fatalf("unseen id estimated %d", got)
	}
	before := s.estimate(42)
	s.halve()
	if got := s.estimate(42); got != before/2 {
		t.Fatalf("halved %d to %d", before, got)
	}
	s.add(42)
	want := s.estimate(42)
	s.grow(4096)
	if int(s.mask)+1 != 4096 || s.estimate(42) != want || s.estimate(7) > 1 {
		t.Fatalf("grown to %d: estimate %d (want %d), unseen %d", s.mask+1, s.estimate(42), want, s.estimate(7))
	}
	for range 300 {
		s.add(1)
	}
	if got := s.estimate(1); got != 255 {
		t.Fatalf("saturating counter at %d", got)
	}
}

func TestParseKind(t *testing.T) {
	for _, c := range []struct {
		in   string
		want Kind
		ok   bool
	}{{"adaptive", KindAdaptive, true}, {"prefix", KindPrefix, true}, {"lru", KindLRU, true}, {"LRU", "", false}, {"", "", false}} {
		got, err := ParseKind(c.in)
		if (err == nil) != c.ok || got != c.want {
			t.Errorf("ParseKind(%q) = %q, %v", c.in, got, err)
		}
	}
}
