package store

import "sort"

// listVisitHook is called (under the store lock) for each entry a listing
// page examines; tests count them.
var listVisitHook = func() {}

// listIndex keeps blocks in insertion order for paged listings. It is an
// append-only slice of (seq, block) with holes where blocks left; it is
// compacted when half of it is holes, so a page costs O(log n + limit)
// amortized and never a walk over every block. Guarded by the store's mu.
type listIndex struct {
	ents  []listEnt
	holes int
}

type listEnt struct {
	seq uint64 // insertion sequence, increasing along ents
	b   *Block // nil: the block left the index
}

// pos is where a block sits in the two indexes it is in.
type listPos struct{ all, ns int }

// add appends b (whose seq is larger than every seq in x) and returns its
// position.
func (x *listIndex) add(b *Block) int {
	x.ents = append(x.ents, listEnt{seq: b.seq, b: b})
	return len(x.ents) - 1
}

// remove leaves a hole at i; compact reports whether the caller must
// compact (positions then change).
func (x *listIndex) remove(i int) (compact bool) {
	x.ents[i].b = nil
	x.holes++
	return x.holes > 32 && 2*x.holes > len(x.ents)
}

// compacted drops the holes and calls moved for each block with its new
// position.
func (x *listIndex) compacted(moved func(b *Block, i int)) {
	j := 0
	for _, e := range x.ents {
		if e.b == nil {
			continue
		}
		x.ents[j] = e
		moved(e.b, j)
		j++
	}
	clear(x.ents[j:])
	x.ents = x.ents[:j]
	x.holes = 0
}

func (x *listIndex) live() int { return len(x.ents) - x.holes }

// page returns up to limit blocks with at most maxSlots slots in all (0:
// no bound; the first block always fits) inserted before seq before (0:
// from the newest), newest first, and whether older ones remain.
func (x *listIndex) page(before uint64, limit, maxSlots int) (out []*Block, more bool) {
	end := len(x.ents)
	if before != 0 {
		end = sort.Search(len(x.ents), func(i int) bool { return x.ents[i].seq >= before })
	}
	slots := 0
	for i := end - 1; i >= 0; i-- {
		listVisitHook()
		b := x.ents[i].b
		if b == nil {
			continue
		}
		slots += len(b.sizes)
		if len(out) == limit || (maxSlots > 0 && slots > maxSlots && len(out) > 0) {
			return out, true
		}
		out = append(out, b)
	}
	return out, false
}
