package evict

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// filledAdaptive is an Adaptive following its 1 % shadow (the window
// one block), holding blocks 1..n put without lookups: the window holds
// n, probation the rest.
func filledAdaptive(t *testing.T, n int) (*Adaptive, []*Node) {
	t.Helper()
	a := NewAdaptive()
	a.sh.fixed = true
	a.sh.follow(0)
	nodes := []*Node{nil}
	for id := 1; id <= n; id++ {
		x := &Node{ID: uint64(id)}
		a.Insert(x, nil, false)
		nodes = append(nodes, x)
	}
	if got := a.Stats().Window; got != 0.01 {
		t.Fatalf("window %v, want 0.01", got)
	}
	if r := nodes[n].region; r != regionWindow {
		t.Fatalf("newest block in region %d, want the window", r)
	}
	return a, nodes
}

// TestAdaptiveAdmission: two new blocks looked up push the window's
// block out as a candidate. Seen once, it loses its duel with main's
// victim (ties go to the victim) and goes first; seen often, it wins,
// and main's victim goes first.
func TestAdaptiveAdmission(t *testing.T) {
	t.Run("cold candidate", func(t *testing.T) {
		a, nodes := filledAdaptive(t, 100)
		a.Access([]*Node{nil, nil}, []uint64{700, 701})
		if got := order(a)[0]; got != 100 {
			t.Fatalf("first victim %d, want the candidate 100", got)
		}
		if nodes[100].region != regionOutcast || nodes[1].region != regionProbation {
			t.Fatalf("regions %d, %d: want the candidate cast out, main's victim kept", nodes[100].region, nodes[1].region)
		}
	})
	t.Run("frequent candidate", func(t *testing.T) {
		a, nodes := filledAdaptive(t, 100)
		for range 5 {
			a.Access([]*Node{nodes[100]}, []uint64{100})
		}
		a.Access([]*Node{nil, nil}, []uint64{700, 701})
		if got := order(a)[0]; got != 1 {
			t.Fatalf("first victim %d, want main's victim 1", got)
		}
		if nodes[100].region != regionProbation {
			t.Fatalf("admitted candidate in region %d, want probation", nodes[100].region)
		}
	})
}

// TestAdaptiveLastBlockFirst: the block put for a looked-up chain's
// last key goes first (after fetched copies); the blocks before it keep
// their order.
func TestAdaptiveLastBlockFirst(t *testing.T) {
	a, _ := filledAdaptive(t, 10)
	ids := []uint64{20, 21, 22}
	a.Access([]*Node{nil, nil, nil}, ids)
	var parent *Node
	for _, id := range ids {
		n := &Node{ID: id}
		a.Insert(n, parent, false)
		parent = n
	}
	if got := order(a)[0]; got != 22 {
		t.Fatalf("first victim %d, want the chain's last block 22", got)
	}
}

// TestAdaptiveFetchedFirst: a fetched copy goes before every own block.
func TestAdaptiveFetchedFirst(t *testing.T) {
	a := NewAdaptive()
	for id := uint64(1); id <= 5; id++ {
		a.Insert(&Node{ID: id}, nil, id == 4)
	}
	if got := order(a)[0]; got != 4 {
		t.Fatalf("first victim %d, want the fetched copy 4", got)
	}
}

// TestAdaptiveInvariants: random inserts, chain accesses, switches of
// shadow, evictions and removals; after each step the walk yields every
// live node once, each after its live children, Len and kids counts
// match, and the blocks mirror the followed shadow.
func TestAdaptiveInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	a := NewAdaptive()
	var live []*Node
	next := uint64(1)
	for step := 0; step < 2000; step++ {
		switch r := rng.IntN(10); {
		case r < 5 || len(live) == 0:
			var parent *Node
			if len(live) > 0 && rng.IntN(2) == 0 {
				parent = live[rng.IntN(len(live))]
			}
			for range 1 + rng.IntN(4) {
				n := &Node{ID: next}
				next++
				a.Insert(n, parent, rng.IntN(8) == 0)
				live = append(live, n)
				parent = n
			}
		case r < 8:
			var chain []*Node
			var ids []uint64
			for n := live[rng.IntN(len(live))]; n != nil; n = n.Parent() {
				chain = append(chain, n)
				ids = append(ids, n.ID)
			}
			slices.Reverse(chain)
			slices.Reverse(ids)
			a.Access(append(chain, nil), append(ids, next+1000))
		case r < 9 && rng.IntN(4) == 0: // a switch of shadow
			a.sh.follow(rng.IntN(len(a.sh.all)))
			a.follow()
		default:
			var v *Node
			if rng.IntN(3) > 0 {
				a.Walk(func(n *Node) bool { v = n; return false })
			} else {
				v = live[rng.IntN(len(live))]
			}
			a.Remove(v)
			live = slices.DeleteFunc(live, func(n *Node) bool { return n == v })
		}
		checkPrefix(t, a, live)
		checkMirror(t, a, live)
		if t.Failed() {
			t.Fatalf("step %d", step)
		}
	}
	if a.capacity == 0 {
		t.Fatalf("capacity %d: never sized", a.capacity)
	}
}

// checkMirror: an own block the followed shadow does not hold is an
// outcast; one in a W-TinyLFU region is where the shadow has its id.
func checkMirror(t *testing.T, a *Adaptive, live []*Node) {
	t.Helper()
	sh := a.sh.followed()
	for _, n := range live {
		e := sh.at[n.ID]
		switch {
		case n.fetched:
			if n.region != regionFetched {
				t.Errorf("fetched %d in region %d", n.ID, n.region)
			}
		case e == nil:
			if n.region != regionOutcast {
				t.Errorf("block %d not in the shadow, in region %d", n.ID, n.region)
			}
		case n.region != regionOutcast && n.region != e.reg:
			t.Errorf("block %d in region %d, the shadow's in %d", n.ID, n.region, e.reg)
		}
	}
}
