package store

import (
	"encoding/binary"

	"github.com/bits-and-blooms/bloom/v3"
)

// Recomputed blocks: a local put of a block this node held before and
// evicted is prefill done again only because the pool was too small (a
// capacity miss). Their count, beside the lookups' hits and misses, is the
// hit-ratio ceiling that operators compare the real ratio with
// (metrics.Engine, docs/operations.md).
//
// The estimate is fed by evictions and puts, not by lookups: a scheduler
// looks the same waiting request up again and again, so a ceiling built
// from the hashes lookups ask for would count each repeat as a hit a
// larger cache could have had. A put happens once per prefill.
//
// The evicted hashes are remembered in two Bloom filters, a current and
// an older generation. Each generation takes recomputeSpan × the most
// blocks the index has held (at least minRecomputeBlocks) evictions; when
// the current one is full the older is dropped and a new one begins. So
// the sketch remembers at least the last 5 × and at most the last 10 ×
// the pool's blocks evictions; a put of a block evicted before that counts
// as a first put. A generation's false positive rate is recomputeFP: at
// most about 0.2 % of first puts are counted as recomputed. Bloom
// filters forget nothing one by one: a block evicted, put again, deleted
// (not evicted) and put once more within the window counts both times.

const (
	recomputeSpan      = 5     // evictions per generation, × the pool's peak blocks
	minRecomputeBlocks = 1024  // the peak assumed at least (small pools, early evictions)
	recomputeFP        = 0.001 // per generation
)

// recomputeSketch is the evicted-hash memory; the store's mu guards it.
type recomputeSketch struct {
	cur, old       *bloom.BloomFilter // nil until the first eviction
	curCap, oldCap uint               // the evictions each generation was sized for
	adds           uint               // evictions added to cur
	peak           int                // the most blocks the index has held
}

// evicted remembers id, the Node.ID of a block evicted from the pool
// while indexed blocks (id's included) were indexed.
func (r *recomputeSketch) evicted(id uint64, indexed int) {
	r.peak = max(r.peak, indexed)
	if r.cur == nil || r.adds >= r.curCap {
		r.rotate()
	}
	b := idBytes(id)
	r.cur.Add(b[:])
	r.adds++
}

// rotate drops the older generation and starts a new current one, sized
// for recomputeSpan × the peak (reusing the older one's bits when it was
// sized the same).
func (r *recomputeSketch) rotate() {
	n := uint(recomputeSpan * max(r.peak, minRecomputeBlocks))
	next := r.old
	if next != nil && r.oldCap == n {
		next.ClearAll()
	} else {
		next = bloom.NewWithEstimates(n, recomputeFP)
	}
	r.old, r.oldCap = r.cur, r.curCap
	r.cur, r.curCap, r.adds = next, n, 0
}

// seen reports whether id was evicted within the window.
func (r *recomputeSketch) seen(id uint64) bool {
	if r.cur == nil {
		return false
	}
	b := idBytes(id)
	return r.cur.Test(b[:]) || (r.old != nil && r.old.Test(b[:]))
}

func idBytes(id uint64) [8]byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], id)
	return b
}

// OnRecomputed installs f, told the namespace of each local put of a
// block evicted within the sketch's window (nil removes it). f runs under
// the store's lock and must only count (metrics.Engine.Recomputed).
func (s *Store) OnRecomputed(f func(namespace string)) {
	if f == nil {
		s.onRecomputed.Store(nil)
		return
	}
	s.onRecomputed.Store(&f)
}

// Recomputed is how many local puts were of blocks evicted within the
// window, since the store began.
func (s *Store) Recomputed() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.recomputedN
}

// evictedLocked remembers b, evicted to make room.
func (s *Store) evictedLocked(b *Block) { s.recompute.evicted(b.node.ID, s.index.len()) }

// putLocked counts b, just indexed by a local put (not a fetched copy, not
// a promotion from the lower tier), when it had been evicted.
func (s *Store) putLocked(b *Block) {
	if !s.recompute.seen(b.node.ID) {
		return
	}
	s.recomputedN++
	if f := s.onRecomputed.Load(); f != nil {
		(*f)(b.key.Namespace)
	}
}
