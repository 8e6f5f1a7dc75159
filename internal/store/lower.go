package store

// A lower tier (internal/ssd) sits under the pool: blocks that eviction
// drops are offered to it, and a lookup that misses the pool asks it
// before answering "missing" (promotion).
//
// Spilling happens under the store's lock, on the goroutine that evicts
// (an allocation that needed room): the evicted extent's memory is freed
// right after, so the bytes must be copied out before. Lower.Spill
// therefore gets a fill function that copies the block (slot order, as
// Read gives it) into a buffer the tier provides; the tier either
// accepts (it has room in its write queue: one memcpy of the block, no
// I/O, no waiting) or refuses and counts a drop. It must never block,
// take a lock held while calling the store, or call the store.
//
// Promotion happens in Pin (lease, lookup, get, peer query: every reader
// pins) and in Promote (prefetch), outside the store's lock: the block
// is read back from the tier synchronously, put into the pool like a
// local put (which may evict, and so spill, other blocks), then pinned.
// A caller of Pin whose key is only on the tier therefore waits for one
// read: it answers after the read, never "loading".

import (
	"context"
	"errors"

	"github.com/pegaflow/pegad/internal/metrics"
)

// Lower is a slower tier under the pool.
type Lower interface {
	// Spill offers an evicted block. If the tier takes it, it calls fill
	// once, synchronously, with a buffer of size bytes. Called under the
	// store's lock: it must return at once.
	Spill(key Key, sizes []SlotSize, size uint64, fill func(dst []byte))
	// SpillWait is Spill that waits for room instead of dropping, until
	// ctx ends (FlushLower). Never called under the store's lock.
	SpillWait(ctx context.Context, key Key, sizes []SlotSize, size uint64, fill func(dst []byte)) error
	// Has reports whether the tier holds key (cheap: an index lookup).
	Has(key Key) bool
	// Load reads key back and hands its slot sizes and bytes (slot
	// order) to use, which must not keep them; use runs without the
	// tier's locks (it puts the block into the store). An error means
	// the block is not served (absent, failed its checksum, unreadable);
	// the tier counts and forgets what failed.
	Load(key Key, use func(sizes []SlotSize, data []byte) error) error
	// Forget drops key (Delete); it reports whether the tier held it.
	Forget(key Key) bool
}

// SetLower installs the lower tier and its hit counters (m may be nil).
// Call it once, before the store is used.
func (s *Store) SetLower(l Lower, m *metrics.Tier) {
	s.lower, s.tierMetrics = l, m
}

// spillLocked offers b to the lower tier before eviction frees it.
func (s *Store) spillLocked(b *Block) {
	if s.lower == nil {
		return
	}
	s.lower.Spill(b.key, b.sizes, b.size, b.gather)
}

// gather copies the block's bytes (slot order) into dst; the caller keeps
// its memory alive (the store's lock during eviction, or a pin).
func (b *Block) gather(dst []byte) {
	base := b.ext.alloc.Off
	n := 0
	for _, sl := range b.slots {
		for _, seg := range []Segment{sl.K, sl.V} {
			if seg.Len > 0 {
				n += copy(dst[n:], b.ext.mem[seg.Off-base:seg.Off-base+seg.Len])
			}
		}
	}
}

// FlushLower writes every block of the pool that the lower tier lacks to
// it, most recently used first, waiting for room in its queue until ctx
// ends (a clean stop: so the pool's blocks survive the restart). Each
// block is pinned while it is copied. It returns how many it handed over.
func (s *Store) FlushLower(ctx context.Context) (int, error) {
	if s.lower == nil {
		return 0, nil
	}
	s.mu.Lock()
	keys := make([]Key, 0, len(s.index))
	for el := s.lru.Front(); el != nil; el = el.Next() {
		keys = append(keys, el.Value.(*Block).key)
	}
	s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if s.lower.Has(k) {
			continue
		}
		found, _ := s.pinFound([]Key{k})
		b := found[0]
		if b == nil {
			continue // gone since
		}
		err := s.lower.SpillWait(ctx, k, b.sizes, b.size, b.gather)
		s.Unpin(found)
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// promote reads key back from the lower tier into the pool; it reports
// whether the key is indexed now (promoted, or put meanwhile by someone
// else).
func (s *Store) promote(key Key) bool {
	if s.lower == nil || !s.lower.Has(key) {
		return false
	}
	err := s.lower.Load(key, func(sizes []SlotSize, data []byte) error {
		_, err := s.Put(key, sizes, func(buf []byte) error {
			if len(buf) != len(data) {
				return errors.New("lower tier block size disagrees with its slots")
			}
			copy(buf, data)
			return nil
		})
		return err
	})
	if err != nil {
		return false
	}
	if s.tierMetrics != nil {
		s.tierMetrics.Promotions.Inc()
	}
	return true
}

// Promote reads every key that is only on the lower tier back into the
// pool (prefetch asks for it before fetching from peers); it returns how
// many it promoted.
func (s *Store) Promote(keys []Key) int {
	if s.lower == nil {
		return 0
	}
	n := 0
	for _, k := range keys {
		if !s.Has(k) && s.promote(k) {
			n++
			s.countHit(metrics.TierSSD, 1)
		}
	}
	return n
}

func (s *Store) countHit(tier string, n int) {
	if s.tierMetrics != nil && n > 0 {
		s.tierMetrics.Hits.WithLabelValues(tier).Add(float64(n))
	}
}

// LowerEntry is a listing row of a block on the lower tier.
type LowerEntry struct {
	Key   Key
	Slots []SlotSize
	Size  uint64
	Seq   uint64 // the tier's write order: a later write has a larger one
}

// LowerLister is a Lower that lists what it holds (pegactl blocks list).
type LowerLister interface {
	// Page lists up to limit blocks of ns ("" = all) written before seq
	// before (0: from the newest), newest first, leaving out those skip
	// reports; next is the cursor of the following page (0: none).
	Page(ns string, before uint64, limit int, skip func(Key) bool) (entries []LowerEntry, next uint64)
}

// HasLower reports whether the store has a lower tier.
func (s *Store) HasLower() bool { return s.lower != nil }

// OnLower reports whether the lower tier holds key.
func (s *Store) OnLower(key Key) bool { return s.lower != nil && s.lower.Has(key) }

// LowerPage lists a page of the blocks that are only on the lower tier
// (LowerLister.Page, skipping those in the pool); nothing without a
// lister.
func (s *Store) LowerPage(ns string, before uint64, limit int) (entries []LowerEntry, next uint64) {
	l, ok := s.lower.(LowerLister)
	if !ok {
		return nil, 0
	}
	return l.Page(ns, before, limit, s.Has)
}
