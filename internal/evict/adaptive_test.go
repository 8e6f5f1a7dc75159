package evict

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestAdaptiveAdmission: a window victim seen once loses its duel with
// a main block seen often, and goes first; one seen more often wins and
// main's victim goes first.
func TestAdaptiveAdmission(t *testing.T) {
	a := NewAdaptive()
	a.sh.fixed, a.sh.best = true, 0 // 1 % window: one block
	hot := &Node{ID: 1}
	a.Insert(hot, nil, false)
	for range 5 {
		a.Access([]*Node{hot}, nil)
	}
	cold := &Node{ID: 2}
	a.Insert(cold, nil, false) // hot overflows to candidate, then probation
	a.Insert(&Node{ID: 3}, nil, false)
	// cold is now the candidate (count 1) against hot (count 6).
	if got := order(a); !slices.Equal(got, []uint64{2, 1, 3}) {
		t.Fatalf("order %v, want the cold candidate first [2 1 3]", got)
	}
	for range 9 {
		a.Access([]*Node{cold}, nil)
	}
	// A hit promotes the candidate: main is then probation (empty) and
	// protected; the window's 3 is last.
	if r := cold.region; r != regionProtected {
		t.Fatalf("hit candidate in region %d, want protected", r)
	}
	n4 := &Node{ID: 4}
	a.Insert(n4, nil, false) // 3 becomes the candidate (count 1)
	for range 20 {
		a.Access([]*Node{nil, n4}, []uint64{99, 4})
	}
	// 4 is the window block; 3 the candidate, count 1, loses to main's
	// victim hot (count 6).
	if got := order(a)[0]; got != 3 {
		t.Fatalf("first victim %d, want the candidate 3", got)
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

// TestAdaptiveInvariants: random inserts, chain accesses, evictions and
// removals; after each step the walk yields every live node once, Len
// matches, and the regions' counts add up.
func TestAdaptiveInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	a := NewAdaptive()
	var live []*Node
	next := uint64(1)
	for step := 0; step < 5000; step++ {
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
		seen := map[*Node]bool{}
		a.Walk(func(n *Node) bool {
			if seen[n] {
				t.Fatalf("step %d: node %d yielded twice", step, n.ID)
			}
			seen[n] = true
			return true
		})
		if len(seen) != len(live) || a.Len() != len(live) {
			t.Fatalf("step %d: walk %d, len %d, live %d", step, len(seen), a.Len(), len(live))
		}
	}
	if a.capacity == 0 || a.wCap == 0 {
		t.Fatalf("capacity %d, window %d: never sized", a.capacity, a.wCap)
	}
}
