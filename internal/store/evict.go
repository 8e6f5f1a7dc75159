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
	return s.AllocExtentFor(node, "", n)
}

// AllocExtentFor is AllocExtentOn of room for a block of namespace ns
// (""; none named): when ns is at its quota (quota.go), it evicts ns's own
// blocks to make room, or fails with ErrQuotaExceeded and changes nothing.
func (s *Store) AllocExtentFor(node int, ns string, n uint64) (*Extent, error) {
	if n == 0 {
		return nil, fmt.Errorf("%w: extent of 0 bytes", ErrInvalid)
	}
	if n > s.pool.Size() {
		return nil, fmt.Errorf("store: extent of %d bytes is larger than the whole pool (%d): %w", n, s.pool.Size(), ErrNoSpace)
	}
	if m := s.pool.MaxAlloc(); n > m {
		return nil, fmt.Errorf("store: extent of %d bytes is larger than a NUMA part of the pool (%d): %w", n, m, ErrNoSpace)
	}
	if s.quotas.Load().of(ns).fitsNow(n) {
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
	}

	// Slow path, serialised by mu: no Insert can add blocks meanwhile, so
	// every round evicts at least one block of a finite, shrinking index
	// and the loop ends. A round can come up short only when someone else
	// took the room on the fast path; then we plan again.
	s.mu.Lock()
	defer s.unlockNotify()
	g := s.quotas.Load().of(ns) // stable while mu is held
	need := (n + pool.Alignment - 1) &^ uint64(pool.Alignment-1)
	for {
		over := g.excess(n)
		a, err := s.pool.AllocOn(node, n) // node first, else any (as the fast path)
		if err == nil {
			if over == 0 {
				return s.newExtentLocked(a), nil
			}
			// Room in the pool, none in the quota: free g's own bytes.
			victims := s.planEvictionLocked(0, g, over)
			if victims == nil {
				s.freeUnusedLocked(a)
				return nil, s.refuseLocked(g, n)
			}
			s.evictLocked(victims, g)
			return s.newExtentLocked(a), nil
		}
		if !errors.Is(err, pool.ErrNoSpace) {
			return nil, fmt.Errorf("store: alloc %d bytes: %w", n, err)
		}
		if over == 0 {
			victims := s.planEvictionLocked(need, nil, 0)
			if len(victims) == 0 {
				return nil, fmt.Errorf("store: %d bytes do not fit even after evicting every unpinned block: %w", n, err)
			}
			s.evictNeed += need
			s.evictLocked(victims, nil)
			continue
		}
		// At its quota and the pool full: g's own blocks must give both
		// the quota's bytes and a contiguous range.
		victims := s.planEvictionLocked(need, g, over)
		if victims == nil {
			return nil, s.refuseLocked(g, n)
		}
		s.evictNeed += need
		s.evictLocked(victims, g)
	}
}

// freeUnusedLocked gives back a, just allocated and never handed out.
func (s *Store) freeUnusedLocked(a pool.Alloc) {
	if err := s.pool.Free(a); err != nil {
		s.underflowLocked("pool refused free of an unused allocation: " + err.Error())
	}
}

// evictLocked evicts victims (offering each to the lower tier first);
// g is the quota group they are evicted for (nil: the pool).
func (s *Store) evictLocked(victims []*Block, g *quotaGroup) {
	if len(victims) == 0 {
		return
	}
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
	if g != nil {
		g.evictions += uint64(len(victims))
		if g.evictC != nil {
			g.evictC.Add(float64(len(victims)))
		}
	}
	if s.m != nil {
		s.m.EvictionWeight.Set(s.policy.Stats().Weight)
	}
}

func (s *Store) newExtentLocked(a pool.Alloc) *Extent {
	s.poolMetricLocked()
	return &Extent{s: s, alloc: a, mem: s.pool.Slice(a), refs: 1}
}

// planEvictionLocked walks the unpinned blocks in the policy's order, and
// returns the shortest prefix of that order whose eviction frees a
// contiguous range of need bytes (0: no range needed), keeping only the
// blocks whose eviction actually frees memory within that prefix: a block
// whose extent stays referenced (by a pinned block, a later block, or an
// allocator still holding it) would be evicted for nothing. nil when no
// prefix works.
//
// With a quota group g it walks g's blocks alone, and the prefix must
// also hold at least over bytes of them; then every block of the prefix
// is a victim, since each one's bytes count against the quota whether or
// not its memory frees.
//
// It simulates without touching anything: freed extents are merged with the
// pool's free neighbours (pool.FreeAround) and with each other into runs
// kept in two maps keyed by their start and end offsets.
func (s *Store) planEvictionLocked(need uint64, g *quotaGroup, over uint64) []*Block {
	var (
		seen    = make(map[*Extent]int) // unpinned indexed blocks seen per extent
		cands   []*Block
		byStart = make(map[uint64]uint64) // run start → end
		byEnd   = make(map[uint64]uint64) // run end → start
		room    = need == 0               // a run of need bytes is planned
		freed   uint64                    // bytes of g's blocks in cands
	)
	var victims []*Block
	s.policy.Walk(func(n *evict.Node) bool {
		b := n.Value.(*Block)
		if b.pins > 0 || (g != nil && b.quota != g) {
			return true
		}
		e := b.ext
		seen[e]++
		cands = append(cands, b)
		freed += b.size
		if !room && seen[e] == e.refs {
			room = s.mergeRunLocked(e.alloc, byStart, byEnd) >= need
		}
		if !room || (g != nil && freed < over) {
			return true
		}
		for _, c := range cands {
			if g != nil || seen[c.ext] == c.ext.refs {
				victims = append(victims, c)
			}
		}
		return false
	})
	return victims
}

// mergeRunLocked adds a's range, as if freed, to the simulated free runs
// and returns the length of the run it is now part of.
func (s *Store) mergeRunLocked(a pool.Alloc, byStart, byEnd map[uint64]uint64) uint64 {
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
	return end - start
}
