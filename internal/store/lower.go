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
//
// A Delete wins over a promotion that races it. The read runs with no
// lock held, so a Delete can come between it and the promoted Put: it
// finds nothing in the pool and the tier forgets the block. Each key
// being promoted therefore has a generation (Store.promoting) that Delete
// bumps under the store's lock, and the promoted Put commits only if the
// generation is the one its promotion started at: else the block is not
// put back (it would resurrect a deleted block, and refuse a re-put of
// the key with new bytes as already indexed).

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
	keys := make([]Key, 0, s.index.len())
	for el := s.lru.Front(); el != nil; el = el.Next() {
		keys = append(keys, el.Value.(*Block).key)
	}
	s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if s.lower.Has(k) {
			continue
		}
		found, _ := s.pinFound(chain{keys: []Key{k}}, nil)
		b := found[0]
		if b == nil {
			continue // gone since
		}
		ok, err := s.flushOne(ctx, k, b)
		s.Unpin(found)
		if err != nil {
			return n, err
		}
		if ok {
			n++
		}
	}
	return n, nil
}

// flushOne hands b (pinned by the caller) to the lower tier. A Delete of
// its key while SpillWait runs, with no lock held, found nothing on the
// tier to forget, so the record handed over is forgotten here: otherwise a
// restart would bring back a block whose Delete succeeded. The same
// generation guard as a promotion's; ok is false when the Delete won.
func (s *Store) flushOne(ctx context.Context, k Key, b *Block) (ok bool, err error) {
	g := s.beginPromote(k)
	defer s.endPromote(k, g)
	if err := s.lower.SpillWait(ctx, k, b.sizes, b.size, b.gather); err != nil {
		return false, err
	}
	s.mu.Lock()
	canceled := g.canceledLocked()
	s.mu.Unlock()
	if canceled {
		// After SpillWait returned: the tier orders this Forget after the
		// record it took (ssd's tombstone ordering).
		s.lower.Forget(k)
		return false, nil
	}
	return true, nil
}

// errPromotionCanceled: the key was deleted while its promotion read it
// back; the promoted Put does not commit.
var errPromotionCanceled = errors.New("store: deleted during its promotion")

// promoteGapHook runs in promote between the tier's read and the Put that
// commits it, with no lock held; tests delete the key there.
var promoteGapHook = func() {}

// promotion is the promotions of one key in flight (Store.promoting), and
// FlushLower's copies of it to the tier: writes that a Delete cancels.
type promotion struct {
	n   int    // promotions of the key under way
	gen uint64 // bumped by each Delete of the key while n > 0
}

// promoteGuard is what one promotion's Put checks before it commits:
// the generation its promotion started at.
type promoteGuard struct {
	p   *promotion
	gen uint64
}

// beginPromote registers a promotion of key; endPromote ends it.
func (s *Store) beginPromote(key Key) *promoteGuard {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.promoting == nil {
		s.promoting = make(map[Key]*promotion)
	}
	p := s.promoting[key]
	if p == nil {
		p = &promotion{}
		s.promoting[key] = p
	}
	p.n++
	return &promoteGuard{p: p, gen: p.gen}
}

func (s *Store) endPromote(key Key, g *promoteGuard) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.p.n--; g.p.n == 0 {
		delete(s.promoting, key)
	}
}

// cancelPromotionsLocked makes the promotions of key under way fail to
// commit (Delete).
func (s *Store) cancelPromotionsLocked(key Key) {
	if p := s.promoting[key]; p != nil {
		p.gen++
	}
}

// canceledLocked reports whether g's promotion lost to a Delete; a nil g
// (not a promotion) never did.
func (g *promoteGuard) canceledLocked() bool { return g != nil && g.p.gen != g.gen }

// promote reads key back from the lower tier into the pool; it reports
// whether the key is indexed now (promoted, or put meanwhile by someone
// else). A Delete of key during the read wins: nothing is put back.
func (s *Store) promote(key Key) bool {
	if s.lower == nil || !s.lower.Has(key) {
		return false
	}
	ck, err := checkKey(key) // once for this promotion: put trusts it
	if err != nil {
		return false
	}
	g := s.beginPromote(key)
	defer s.endPromote(key, g)
	err = s.lower.Load(key, func(sizes []SlotSize, data []byte) error {
		promoteGapHook()
		_, err := s.put(ck, sizes, func(buf []byte) error {
			if len(buf) != len(data) {
				return errors.New("lower tier block size disagrees with its slots")
			}
			copy(buf, data)
			return nil
		}, g)
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
