package store

import (
	"errors"
	"fmt"

	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/pool"
)

// AllocExtent allocates n bytes, evicting unpinned blocks in the policy's
// order (Policy.Walk) until it fits; ErrNoSpace (and nothing evicted beyond need) when it cannot. The
// caller holds one reference and must ReleaseExtent it.
//
// Eviction is planned before anything is evicted (see planEvictionLocked):
// when even evicting every unpinned block would not make a contiguous range
// of n bytes, nothing is evicted and ErrNoSpace is returned, so a put that
// cannot fit leaves the store as it was.
func (s *Store) AllocExtent(n uint64) (*Extent, error) { return s.AllocExtentOn(-1, n) }

// AllocExtentOn is AllocExtent with the extent placed on NUMA node node
// where the pool has room there, else on any node (pool.AllocOn; node < 0:
// any node); it evicts only when n bytes fit nowhere.
func (s *Store) AllocExtentOn(node int, n uint64) (*Extent, error) {
	if n == 0 {
		return nil, fmt.Errorf("%w: extent of 0 bytes", ErrInvalid)
	}
	if n > s.pool.Size() {
		return nil, fmt.Errorf("store: extent of %d bytes is larger than the whole pool (%d): %w", n, s.pool.Size(), ErrNoSpace)
	}
	if m := s.pool.MaxAlloc(); n > m {
		return nil, fmt.Errorf("store: extent of %d bytes is larger than a NUMA part of the pool (%d): %w", n, m, ErrNoSpace)
	}
	// Fast path: no eviction needed, no store lock held while allocating.
	a, err := s.pool.AllocOn(node, n)
	if err == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.newExtentLocked(a), nil
	}
	if !errors.Is(err, pool.ErrNoSpace) {
		return nil, fmt.Errorf("store: alloc %d bytes: %w", n, err)
	}

	// Slow path, serialised by mu: no Insert can add blocks meanwhile, so
	// every round evicts at least one block of a finite, shrinking index
	// and the loop ends. A round can come up short only when someone else
	// took the room on the fast path; then we plan again.
	s.mu.Lock()
	defer s.unlockNotify()
	need := (n + pool.Alignment - 1) &^ uint64(pool.Alignment-1)
	for {
		a, err := s.pool.Alloc(n)
		if err == nil {
			return s.newExtentLocked(a), nil
		}
		if !errors.Is(err, pool.ErrNoSpace) {
			return nil, fmt.Errorf("store: alloc %d bytes: %w", n, err)
		}
		victims := s.planEvictionLocked(need)
		if len(victims) == 0 {
			return nil, fmt.Errorf("store: %d bytes do not fit even after evicting every unpinned block: %w", n, err)
		}
		s.evictNeed += need
		for _, b := range victims {
			s.spillLocked(b) // before removeLocked frees its memory
			s.evictedLocked(b)
			s.removeLocked(b, Evicted)
			s.evictions++
			s.evictedBytes += b.size
			if s.m != nil {
				s.m.Evictions.Inc()
				s.m.EvictedBytes.Add(float64(b.size))
			}
		}
		if s.m != nil {
			s.m.EvictionWeight.Set(s.policy.Stats().Weight)
		}
	}
}

func (s *Store) newExtentLocked(a pool.Alloc) *Extent {
	s.poolMetricLocked()
	return &Extent{s: s, alloc: a, mem: s.pool.Slice(a), refs: 1}
}

// planEvictionLocked walks the unpinned blocks in the policy's order, and
// returns the shortest prefix of that order whose eviction frees a
// contiguous range of need bytes, keeping only the blocks whose eviction
// actually frees memory within that prefix: a block whose extent stays
// referenced (by a pinned block, a later block, or an allocator still
// holding it) would be evicted for nothing. nil when no prefix works.
//
// It simulates without touching anything: freed extents are merged with the
// pool's free neighbours (pool.FreeAround) and with each other into runs
// kept in two maps keyed by their start and end offsets.
func (s *Store) planEvictionLocked(need uint64) []*Block {
	var (
		seen    = make(map[*Extent]int) // unpinned indexed blocks seen per extent
		cands   []*Block
		byStart = make(map[uint64]uint64) // run start → end
		byEnd   = make(map[uint64]uint64) // run end → start
	)
	var victims []*Block
	s.policy.Walk(func(n *evict.Node) bool {
		b := n.Value.(*Block)
		if b.pins > 0 {
			return true
		}
		e := b.ext
		seen[e]++
		cands = append(cands, b)
		if seen[e] < e.refs {
			return true // other references keep e's memory (so far)
		}
		a := e.alloc
		before, after := s.pool.FreeAround(a)
		start, end := a.Off, a.Off+a.Len
		// A simulated run already ending at start has absorbed the pool's
		// free range there (if any); only otherwise take the pool's.
		// Runs never merge across a NUMA part boundary of the pool.
		if st, ok := byEnd[start]; ok && !s.pool.Boundary(start) {
			delete(byEnd, start)
			delete(byStart, st)
			start = st
		} else {
			start -= before
		}
		if en, ok := byStart[end]; ok && !s.pool.Boundary(end) {
			delete(byStart, end)
			delete(byEnd, en)
			end = en
		} else {
			end += after
		}
		byStart[start], byEnd[end] = end, start
		if end-start < need {
			return true
		}
		for _, c := range cands {
			if seen[c.ext] == c.ext.refs {
				victims = append(victims, c)
			}
		}
		return false
	})
	return victims
}
