// Package store is pegad's block index: (namespace, hash) → block, where a
// block is a list of slots (one per tensor-parallel rank), each a K segment
// and an optional V segment, living in pool memory. It evicts unpinned
// blocks in LRU order when an allocation needs room, offering them to a
// lower tier first when one is set (lower.go: the SSD tier), and reads a
// block back from that tier when a lookup misses the pool.
//
// Memory is held through extents: a refcounted pool allocation that one or
// many blocks' segments live in (a local put makes one extent per block; a
// prefetch stages many blocks in one extent of up to 256 MiB). An extent's
// memory returns to the pool when its last reference goes.
//
// The store must never free or reuse memory of a pinned block, even after
// the block left the index (eviction, delete, replacement): the pin keeps it.
//
// References: whoever allocates an extent holds one reference; every block
// holds one reference on its extent from Insert until it is both out of the
// index and unpinned. So an extent shared by many blocks (a prefetch) frees
// only when its last block goes: evicting one block of it frees nothing
// (eviction amplification, bounded by the 256 MiB staging chunk).
//
// Misuse: Unpin of a block with no pins, or ReleaseExtent of an extent with
// no references, is ignored (state is never corrupted), counted in
// Stats.RefUnderflows, and reported to the package's underflow hook, which
// tests set to fail loudly.
package store

import (
	"container/list"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/pool"
)

var (
	ErrNotFound = errors.New("block not found")
	// ErrNoSpace is pool.ErrNoSpace itself (not a second sentinel): even
	// after evicting every unpinned block the allocation does not fit.
	// Code above the store names this one; errors.Is matches either name.
	ErrNoSpace = pool.ErrNoSpace
	ErrInvalid = errors.New("store: invalid block")
)

// Limits on what a block may be.
const (
	MaxSlots    = 1024
	MaxBlockLen = 1 << 40
)

// ReadChunk is the most Read hands its callback at once.
const ReadChunk = 1 << 20

// Key names a block. Hash is the raw hash bytes held in a string.
type Key struct {
	Namespace string
	Hash      string
}

// SlotSize is the shape of one slot. VSize 0: no V segment.
type SlotSize struct{ KSize, VSize uint64 }

// SlotLayout places one slot inside an extent (offsets relative to the
// extent's first byte).
type SlotLayout struct {
	KOff, KLen uint64
	VOff, VLen uint64 // VLen 0: no V segment
}

// Segment is where one segment lives, absolute in the pool.
type Segment struct {
	Addr uint64 // virtual address
	Off  uint64 // pool offset
	Len  uint64
	NUMA int
}

// Slot of a block; V.Len == 0 when absent.
type Slot struct{ K, V Segment }

// Extent is a refcounted pool allocation.
type Extent struct {
	s     *Store
	alloc pool.Alloc // immutable
	mem   []byte     // immutable
	refs  int        // guarded by s.mu
}

// Alloc is the extent's pool allocation.
func (e *Extent) Alloc() pool.Alloc { return e.alloc }

// Bytes is the extent's memory.
func (e *Extent) Bytes() []byte { return e.mem }

// Block is an indexed block. Its fields are immutable after insertion.
type Block struct {
	// Immutable after Insert.
	key     Key
	ext     *Extent
	slots   []Slot
	sizes   []SlotSize
	size    uint64
	created time.Time
	seq     uint64 // insertion order, for paged listings (set under mu)

	// Guarded by ext.s.mu.
	pins       int
	lastAccess time.Time
	elem       *list.Element // position in the LRU; nil once out of the index
	pos        listPos       // positions in the list indexes while indexed
	node       evict.Node    // the eviction policy's state
	quota      *quotaGroup   // the namespace quota it counts against while indexed; nil: none (quota.go)
}

func (b *Block) Key() Key { return b.key }

// Slots is a copy of the block's segment placement.
func (b *Block) Slots() []Slot { return append([]Slot(nil), b.slots...) }

// NumSlots and Slot read the placement without copying it (a query of
// many blocks builds its answer from them).
func (b *Block) NumSlots() int        { return len(b.slots) }
func (b *Block) Slot(i int) Slot      { return b.slots[i] }
func (b *Block) Size() uint64         { return b.size }
func (b *Block) CreatedAt() time.Time { return b.created }
func (b *Block) Pins() int {
	b.ext.s.mu.Lock()
	defer b.ext.s.mu.Unlock()
	return b.pins
}

// NUMA is the node the block's memory is on.
func (b *Block) NUMA() int { return b.ext.alloc.NUMA }

// Info is a listing row.
type Info struct {
	Key        Key
	Slots      []SlotSize
	Size       uint64
	Pins       int
	NUMA       int
	CreatedAt  time.Time
	LastAccess time.Time
	Fetched    bool // a copy fetched from a peer (InsertFetched)
}

// Stats is a snapshot.
type Stats struct {
	// Blocks and Bytes: indexed blocks. Pinned: blocks with at least one pin,
	// indexed or not. DeferredFree: out of the index, memory kept by pins.
	Blocks, Bytes, Pinned, DeferredFree, Evictions uint64
	Pool                                           pool.Stats
	// RefUnderflows counts Unpin/ReleaseExtent calls that found nothing to
	// drop (caller bugs; ignored).
	RefUnderflows uint64
	// EvictedBytes: bytes of the blocks evicted. EvictNeedBytes: bytes
	// the allocations that evicted asked for (per planning round). Their
	// ratio ≥ 1 is what keeping extents contiguous costs the policy.
	EvictedBytes, EvictNeedBytes uint64
}

// pinGapHook runs in Pin between the lookup and the pinning pass, with no
// lock held; tests remove blocks there.
var pinGapHook = func() {}

// underflowHook is called (under the store lock) on every ref underflow;
// tests replace it to fail.
var underflowHook = func(what string) {}

// Store is safe for concurrent use.
type Store struct {
	pool *pool.Pool       // immutable
	m    *metrics.Metrics // immutable; may be nil

	// mu guards the LRU, every block's pins/lastAccess/elem, every
	// extent's refs and the counters below, and (with idxMu) the index. It
	// is never held while calling a caller's fill or w callback. Lock
	// order: mu, then idxMu, then pool's; the OnEvents subscriber's own
	// lock, if any, comes after mu and is a leaf (events.go).
	mu sync.Mutex
	// idxMu guards index together with mu: index is written only with both
	// held, so either one is enough to read it. Pin and Has look keys up
	// under idxMu alone (read-locked: lookups, which hash every key, run
	// side by side) and take mu only for the short, allocation-free pass
	// that pins what they found; see Pin.
	idxMu sync.RWMutex
	index blockIndex
	// lru holds the indexed blocks (*Block), most recently used at the
	// front: the order of listings and FlushLower, not of eviction.
	lru *list.List
	// policy orders the indexed blocks for eviction (policy.go); hints
	// are parent keys learnt from lookups.
	policy Policy
	hints  map[Key]Key
	// all and byNS list the indexed blocks in insertion order, all of
	// them and per namespace, for paged listings (ListPage).
	all        listIndex
	byNS       map[string]*listIndex
	seq        uint64 // last insertion sequence given out
	bytes      uint64 // sum of indexed blocks' sizes
	pinned     uint64 // blocks with pins > 0
	pinnedSize uint64 // bytes of those blocks (pegaflow_pool_pinned_bytes)
	deferred   uint64 // out of the index, pins > 0
	evictions  uint64
	// evictedBytes: bytes of the blocks evicted; evictNeed: bytes the
	// allocations that evicted asked for (aligned), counted once per
	// planning round. Their ratio is what contiguity costs the policy.
	evictedBytes, evictNeed uint64
	underflows              uint64
	changed                 []Change // keys indexed or removed since mu was taken (events.go)

	onChange atomic.Pointer[func(Key)] // key subscriber, called after unlock (events.go)

	lower       Lower                          // set by SetLower before use, then immutable; nil: none (lower.go)
	tierMetrics *metrics.Tier                  // set with lower; may be nil
	onEvents    atomic.Pointer[func([]Change)] // ordered subscriber, called under mu (events.go)
	// promoting: the keys being read back from the lower tier, guarded
	// by mu; Delete bumps their generation (lower.go).
	promoting map[Key]*promotion

	// recompute remembers evicted hashes and recomputedN counts the
	// local puts found there, both guarded by mu; onRecomputed is told
	// each, under mu (recompute.go).
	recompute    recomputeSketch
	recomputedN  uint64
	onRecomputed atomic.Pointer[func(string)]

	// quotas: the namespace quotas (quota.go), replaced whole by
	// SetQuotas under mu; read without mu only to skip the locked path
	// of an allocation that fits. Their groups' counters are guarded by mu.
	quotas atomic.Pointer[quotaSet]
}

// New creates a store over p that evicts in LRU order. m may be nil (no
// metrics).
func New(p *pool.Pool, m *metrics.Metrics) *Store { return NewWithPolicy(p, m, evict.NewLRU()) }

// NewWithPolicy is New with eviction ordered by pol (NewPolicy), which the
// store owns from here on.
func NewWithPolicy(p *pool.Pool, m *metrics.Metrics, pol Policy) *Store {
	s := &Store{
		pool: p, m: m, index: newBlockIndex(), lru: list.New(), byNS: make(map[string]*listIndex),
		policy: pol, hints: make(map[Key]Key),
	}
	if m != nil {
		m.PoolSize.Set(float64(p.Size()))
		if p.Locked() {
			m.PoolLocked.Set(1)
		} else {
			m.PoolLocked.Set(0)
		}
		m.PoolUsed.Set(float64(p.Used()))
	}
	return s
}

func (s *Store) Pool() *pool.Pool { return s.pool }

// ReleaseExtent drops the caller's reference.
func (s *Store) ReleaseExtent(e *Extent) {
	if e == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unrefLocked(e)
}

// unrefLocked drops one reference on e and frees its memory on the last one;
// it reports whether memory was freed.
func (s *Store) unrefLocked(e *Extent) bool {
	if e.refs <= 0 {
		s.underflowLocked("ReleaseExtent of an extent with no references")
		return false
	}
	e.refs--
	if e.refs > 0 {
		return false
	}
	if err := s.pool.Free(e.alloc); err != nil {
		// The pool's and the store's books disagree: a bug that must not
		// turn into a double free, so keep going but make it visible.
		s.underflowLocked("pool refused extent free: " + err.Error())
		return false
	}
	s.poolMetricLocked()
	return true
}

func (s *Store) underflowLocked(what string) {
	s.underflows++
	underflowHook(what)
}

func (s *Store) poolMetricLocked() {
	if s.m != nil {
		s.m.PoolUsed.Set(float64(s.pool.Used()))
	}
}

func (s *Store) pinnedMetricLocked() {
	if s.m != nil {
		s.m.PoolPinned.Set(float64(s.pinnedSize))
	}
}

func (s *Store) indexMetricsLocked() {
	if s.m != nil {
		s.m.Blocks.Set(float64(s.index.len()))
		s.m.BlockBytes.Set(float64(s.bytes))
		s.m.PinnedDeferred.Set(float64(s.deferred))
	}
}

func validSlotCount(n int) error {
	if n < 1 || n > MaxSlots {
		return fmt.Errorf("%w: %d slots (want 1..%d)", ErrInvalid, n, MaxSlots)
	}
	return nil
}

// inside reports whether [off, off+n) lies inside [0, limit), overflow-safe.
func inside(off, n, limit uint64) bool { return off <= limit && n <= limit-off }

// Insert indexes key with its slots inside e (taking its own reference on
// e). created is false when key was already indexed (the old block is kept
// and nothing changes). ErrInvalid for a layout outside e or bad key.
func (s *Store) Insert(key Key, e *Extent, slots []SlotLayout) (created bool, err error) {
	ck, err := checkKey(key)
	if err != nil {
		return false, err
	}
	return s.insert(ck, e, slots, false, nil)
}

// InsertFetched is Insert of a block copied from another node that holds
// it too (a prefetch): the policy evicts such copies before the blocks
// only this node holds.
func (s *Store) InsertFetched(key Key, e *Extent, slots []SlotLayout) (created bool, err error) {
	ck, err := checkKey(key)
	if err != nil {
		return false, err
	}
	return s.insert(ck, e, slots, true, nil)
}

// insert is InsertChecked; g is the promotion it commits (nil: none),
// which a Delete since the promotion began cancels.
func (s *Store) insert(ck CheckedKey, e *Extent, slots []SlotLayout, fetched bool, g *promoteGuard) (created bool, err error) {
	if !ck.checked() {
		return false, errUnchecked
	}
	key := ck.Key()
	if e == nil || e.s != s {
		return false, fmt.Errorf("%w: extent not from this store", ErrInvalid)
	}
	if err := validSlotCount(len(slots)); err != nil {
		return false, err
	}
	elen := e.alloc.Len
	b := &Block{key: key, ext: e, slots: make([]Slot, len(slots)), sizes: make([]SlotSize, len(slots))}
	b.node.Value, b.node.ID = b, keyID(key)
	seg := func(off, n uint64) Segment {
		return Segment{Addr: s.pool.Addr(e.alloc) + off, Off: e.alloc.Off + off, Len: n, NUMA: e.alloc.NUMA}
	}
	for i, l := range slots {
		if l.KLen == 0 {
			return false, fmt.Errorf("%w: slot %d has an empty K segment", ErrInvalid, i)
		}
		if !inside(l.KOff, l.KLen, elen) {
			return false, fmt.Errorf("%w: slot %d K [%d,+%d) outside the extent of %d bytes", ErrInvalid, i, l.KOff, l.KLen, elen)
		}
		if l.VLen > 0 && !inside(l.VOff, l.VLen, elen) {
			return false, fmt.Errorf("%w: slot %d V [%d,+%d) outside the extent of %d bytes", ErrInvalid, i, l.VOff, l.VLen, elen)
		}
		b.slots[i].K = seg(l.KOff, l.KLen)
		if l.VLen > 0 {
			b.slots[i].V = seg(l.VOff, l.VLen)
		}
		b.sizes[i] = SlotSize{KSize: l.KLen, VSize: l.VLen}
		b.size += l.KLen + l.VLen // each ≤ elen ≤ pool size: no overflow
	}
	if b.size > MaxBlockLen {
		return false, fmt.Errorf("%w: block of %d bytes (max %d)", ErrInvalid, b.size, MaxBlockLen)
	}
	now := time.Now()
	b.created, b.lastAccess = now, now

	s.mu.Lock()
	defer s.unlockNotify()
	if e.refs <= 0 {
		return false, fmt.Errorf("%w: extent already released", ErrInvalid)
	}
	if s.index.get(key) != nil {
		return false, nil
	}
	if g.canceledLocked() {
		return false, errPromotionCanceled
	}
	e.refs++
	b.elem = s.lru.PushFront(b)
	s.policy.Insert(&b.node, s.parentLocked(key), fetched)
	s.idxMu.Lock()
	s.index.add(b)
	s.idxMu.Unlock()
	s.listAddLocked(b)
	s.bytes += b.size
	if !fetched && g == nil {
		s.putLocked(b)
	}
	s.changedLocked(key, Stored)
	s.quotaAddLocked(b) // may evict others of its group: after b's own change
	s.indexMetricsLocked()
	return true, nil
}

// Put is AllocExtent + copy + Insert for local writes: sizes give the shape,
// fill writes the block's bytes (slot 0 K, slot 0 V, slot 1 K, ...) into
// the buffer it is given. Nothing is stored when fill returns an error.
// A key already indexed returns created=false without calling fill.
func (s *Store) Put(key Key, sizes []SlotSize, fill func(buf []byte) error) (created bool, err error) {
	ck, err := checkKey(key)
	if err != nil {
		return false, err
	}
	return s.put(ck, sizes, fill, nil)
}

// put is PutChecked; g is the promotion it commits (nil: a local put).
// Neither it nor insert checks the key again.
func (s *Store) put(ck CheckedKey, sizes []SlotSize, fill func(buf []byte) error, g *promoteGuard) (created bool, err error) {
	if !ck.checked() {
		return false, errUnchecked
	}
	key := ck.Key()
	if err := validSlotCount(len(sizes)); err != nil {
		return false, err
	}
	layout := make([]SlotLayout, len(sizes))
	var total uint64
	for i, sz := range sizes {
		if sz.KSize == 0 {
			return false, fmt.Errorf("%w: slot %d has an empty K segment", ErrInvalid, i)
		}
		if sz.KSize > MaxBlockLen || sz.VSize > MaxBlockLen {
			return false, fmt.Errorf("%w: slot %d larger than %d bytes", ErrInvalid, i, uint64(MaxBlockLen))
		}
		layout[i] = SlotLayout{KOff: total, KLen: sz.KSize}
		total += sz.KSize
		if sz.VSize > 0 {
			layout[i].VOff, layout[i].VLen = total, sz.VSize
			total += sz.VSize
		}
		if total > MaxBlockLen {
			return false, fmt.Errorf("%w: block larger than %d bytes", ErrInvalid, uint64(MaxBlockLen))
		}
	}
	if s.Has(key) {
		return false, nil
	}
	e, err := s.AllocExtentFor(-1, key.Namespace, total)
	if err != nil {
		return false, err
	}
	defer s.ReleaseExtent(e) // Insert takes its own reference
	if err := fill(e.mem[:total]); err != nil {
		return false, fmt.Errorf("store: fill %s/%x: %w", key.Namespace, key.Hash, err)
	}
	return s.insert(ck, e, layout, false, g)
}

// Has reports whether key is indexed (no LRU touch).
func (s *Store) Has(key Key) bool {
	s.idxMu.RLock()
	defer s.idxMu.RUnlock()
	return s.index.get(key) != nil
}

// removeLocked takes b out of the index and the LRU and drops its extent
// reference unless a pin keeps it. It reports whether memory was freed.
func (s *Store) removeLocked(b *Block, why ChangeKind) (freed bool) {
	s.idxMu.Lock()
	s.index.remove(b.key)
	s.idxMu.Unlock()
	s.changedLocked(b.key, why)
	s.lru.Remove(b.elem)
	b.elem = nil
	s.policy.Remove(&b.node)
	s.listRemoveLocked(b)
	s.bytes -= b.size
	s.quotaRemoveLocked(b)
	if b.pins > 0 {
		s.deferred++
	} else {
		freed = s.unrefLocked(b.ext)
	}
	s.indexMetricsLocked()
	return freed
}

// Delete removes key from the index, and from the lower tier; a
// promotion of key under way does not put it back (lower.go). deferred:
// pinned, memory freed later.
func (s *Store) Delete(key Key) (deferred bool, err error) {
	s.mu.Lock()
	defer s.unlockNotify()
	onLower := s.lower != nil && s.lower.Forget(key) // a leaf lock (lower.go)
	s.cancelPromotionsLocked(key)                    // a promotion under way must not put it back
	b := s.index.get(key)
	if b == nil {
		if onLower {
			return false, nil
		}
		return false, fmt.Errorf("%w: namespace=%s hash=%x", ErrNotFound, key.Namespace, key.Hash)
	}
	s.removeLocked(b, Deleted)
	return b.pins > 0, nil
}

func (b *Block) infoLocked() Info {
	return Info{
		Key: b.key, Slots: append([]SlotSize(nil), b.sizes...), Size: b.size, Pins: b.pins,
		NUMA: b.ext.alloc.NUMA, CreatedAt: b.created, LastAccess: b.lastAccess, Fetched: b.node.Fetched(),
	}
}

// List returns up to limit blocks of ns ("" = all), most recent first;
// limit <= 0 means no limit. truncated: more blocks matched.
func (s *Store) List(ns string, limit int) (infos []Info, truncated bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for el := s.lru.Front(); el != nil; el = el.Next() {
		b := el.Value.(*Block)
		if ns != "" && b.key.Namespace != ns {
			continue
		}
		if limit > 0 && len(infos) == limit {
			return infos, true
		}
		infos = append(infos, b.infoLocked())
	}
	return infos, false
}

func (s *Store) listAddLocked(b *Block) {
	s.seq++
	b.seq = s.seq
	nx := s.byNS[b.key.Namespace]
	if nx == nil {
		nx = &listIndex{}
		s.byNS[b.key.Namespace] = nx
	}
	b.pos = listPos{all: s.all.add(b), ns: nx.add(b)}
}

func (s *Store) listRemoveLocked(b *Block) {
	if s.all.remove(b.pos.all) {
		s.all.compacted(func(b *Block, i int) { b.pos.all = i })
	}
	nx := s.byNS[b.key.Namespace]
	if nx.remove(b.pos.ns) {
		nx.compacted(func(b *Block, i int) { b.pos.ns = i })
	}
	if nx.live() == 0 {
		delete(s.byNS, b.key.Namespace)
	}
}

// ListPage returns up to limit (> 0) blocks of ns ("" = all) with at most
// maxSlots slots in all (0: no bound; one block always fits), newest
// first by insertion, starting after cursor (0: from the newest; else the
// next value of an earlier page). next is the cursor of the following
// page, 0 when there is none. Blocks inserted after the first page come
// in no later page; blocks that leave meanwhile are skipped.
//
// The store lock is held only to find the page (O(log n + limit)) and
// snapshot its blocks' mutable fields; the rows are built after.
func (s *Store) ListPage(ns string, cursor uint64, limit, maxSlots int) (infos []Info, next uint64) {
	type snap struct {
		b          *Block
		pins       int
		lastAccess time.Time
		fetched    bool
	}
	s.mu.Lock()
	x := &s.all
	if ns != "" {
		x = s.byNS[ns]
	}
	var blocks []*Block
	more := false
	if x != nil {
		blocks, more = x.page(cursor, max(limit, 1), maxSlots)
	}
	snaps := make([]snap, len(blocks))
	for i, b := range blocks {
		snaps[i] = snap{b, b.pins, b.lastAccess, b.node.Fetched()}
	}
	s.mu.Unlock()

	infos = make([]Info, len(snaps))
	for i, sn := range snaps {
		b := sn.b // key, sizes, size, created, ext: immutable
		infos[i] = Info{
			Key: b.key, Slots: append([]SlotSize(nil), b.sizes...), Size: b.size, Pins: sn.pins,
			NUMA: b.ext.alloc.NUMA, CreatedAt: b.created, LastAccess: sn.lastAccess,
			Fetched: sn.fetched,
		}
	}
	if more {
		next = blocks[len(blocks)-1].seq
	}
	return infos, next
}

// Read copies the block's bytes (slot order) into w chunk by chunk while
// holding a pin. Each chunk (at most ReadChunk bytes) is a private buffer
// reused between calls: w must not keep it. An error from w stops the read
// and is returned wrapped.
func (s *Store) Read(key Key, w func(chunk []byte) error) (Info, error) {
	blocks, _ := s.Pin([]Key{key})
	if len(blocks) == 0 {
		return Info{}, fmt.Errorf("%w: namespace=%s hash=%x", ErrNotFound, key.Namespace, key.Hash)
	}
	b := blocks[0]
	defer s.Unpin(blocks)
	s.mu.Lock()
	info := b.infoLocked()
	s.mu.Unlock()
	return info, s.ReadPinned(b, w)
}

// ReadPinned is Read of block b itself, which the caller holds a pin on
// (from Pin): never a second lookup by key, so a delete and re-put of the
// key meanwhile cannot mix another block's bytes into b's.
func (s *Store) ReadPinned(b *Block, w func(chunk []byte) error) error {
	if b == nil || b.ext.s != s {
		return fmt.Errorf("%w: block not from this store", ErrInvalid)
	}
	if b.Pins() <= 0 {
		return fmt.Errorf("%w: ReadPinned of a block with no pin", ErrInvalid)
	}
	buf := make([]byte, min(b.size, ReadChunk))
	base := b.ext.alloc.Off
	for _, sl := range b.slots {
		for _, seg := range []Segment{sl.K, sl.V} {
			if seg.Len == 0 {
				continue // no V segment
			}
			mem := b.ext.mem[seg.Off-base : seg.Off-base+seg.Len]
			for len(mem) > 0 {
				n := copy(buf, mem)
				mem = mem[n:]
				if err := w(buf[:n]); err != nil {
					return fmt.Errorf("store: read %s/%x: %w", b.key.Namespace, b.key.Hash, err)
				}
			}
		}
	}
	return nil
}

func (s *Store) Stats() Stats {
	s.mu.Lock()
	st := Stats{
		Blocks: uint64(s.index.len()), Bytes: s.bytes, Pinned: s.pinned, DeferredFree: s.deferred,
		Evictions: s.evictions, RefUnderflows: s.underflows,
		EvictedBytes: s.evictedBytes, EvictNeedBytes: s.evictNeed,
	}
	s.mu.Unlock()
	st.Pool = s.pool.Stats()
	return st
}
