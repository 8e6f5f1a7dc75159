// Package store is pegad's block index: (namespace, hash) → block, where a
// block is a list of slots (one per tensor-parallel rank), each a K segment
// and an optional V segment, living in pool memory. It evicts unpinned
// blocks in LRU order when an allocation needs room.
//
// Memory is held through extents: a refcounted pool allocation that one or
// many blocks' segments live in (a local put makes one extent per block; a
// prefetch stages many blocks in one extent of up to 256 MiB). An extent's
// memory returns to the pool when its last reference goes.
//
// The store must never free or reuse memory of a pinned block, even after
// the block left the index (eviction, delete, replacement): the pin keeps it.
//
// API CONTRACT (implementation pending; signatures are fixed):
package store

import (
	"errors"
	"time"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/pool"
)

var (
	ErrNotFound = errors.New("store: block not found")
	// ErrNoSpace wraps pool.ErrNoSpace: even after evicting every unpinned
	// block the allocation does not fit.
	ErrNoSpace = pool.ErrNoSpace
	ErrInvalid = errors.New("store: invalid block")
)

// Limits on what a block may be.
const (
	MaxHashLen  = 64
	MaxNSLen    = 256
	MaxSlots    = 1024
	MaxBlockLen = 1 << 40
)

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
type Extent struct{}

// Alloc is the extent's pool allocation.
func (e *Extent) Alloc() pool.Alloc { panic("unimplemented") }

// Bytes is the extent's memory.
func (e *Extent) Bytes() []byte { panic("unimplemented") }

// Block is an indexed block. Its fields are immutable after insertion.
type Block struct{}

func (b *Block) Key() Key             { panic("unimplemented") }
func (b *Block) Slots() []Slot        { panic("unimplemented") }
func (b *Block) Size() uint64         { panic("unimplemented") }
func (b *Block) CreatedAt() time.Time { panic("unimplemented") }
func (b *Block) Pins() int            { panic("unimplemented") }

// Info is a listing row.
type Info struct {
	Key        Key
	Slots      []SlotSize
	Size       uint64
	Pins       int
	NUMA       int
	CreatedAt  time.Time
	LastAccess time.Time
}

// Stats is a snapshot.
type Stats struct {
	Blocks, Bytes, Pinned, DeferredFree, Evictions uint64
	Pool                                           pool.Stats
}

// Store is safe for concurrent use.
type Store struct{}

// New creates a store over p. m may be nil (no metrics).
func New(p *pool.Pool, m *metrics.Metrics) *Store { panic("unimplemented") }

func (s *Store) Pool() *pool.Pool { panic("unimplemented") }

// AllocExtent allocates n bytes, evicting unpinned blocks in LRU order until
// it fits; ErrNoSpace (and nothing evicted beyond need) when it cannot. The
// caller holds one reference and must ReleaseExtent it.
func (s *Store) AllocExtent(n uint64) (*Extent, error) { panic("unimplemented") }

// ReleaseExtent drops the caller's reference.
func (s *Store) ReleaseExtent(e *Extent) { panic("unimplemented") }

// Insert indexes key with its slots inside e (taking its own reference on
// e). created is false when key was already indexed (the old block is kept
// and nothing changes). ErrInvalid for a layout outside e or bad key.
func (s *Store) Insert(key Key, e *Extent, slots []SlotLayout) (created bool, err error) {
	panic("unimplemented")
}

// Put is AllocExtent + copy + Insert for local writes: sizes give the shape,
// fill writes the block's bytes (slot 0 K, slot 0 V, slot 1 K, ...) into
// the buffer it is given. Nothing is stored when fill returns an error.
func (s *Store) Put(key Key, sizes []SlotSize, fill func(buf []byte) error) (created bool, err error) {
	panic("unimplemented")
}

// Has reports whether key is indexed (no LRU touch).
func (s *Store) Has(key Key) bool { panic("unimplemented") }

// Pin looks up keys and pins the found ones (in order); missing lists the
// indexes of keys not found. A pinned block's memory stays until Unpin.
func (s *Store) Pin(keys []Key) (pinned []*Block, missing []int) { panic("unimplemented") }

// Unpin drops one pin of each block; a block out of the index frees its
// memory on its last unpin.
func (s *Store) Unpin(blocks []*Block) { panic("unimplemented") }

// Delete removes key from the index. deferred: pinned, memory freed later.
func (s *Store) Delete(key Key) (deferred bool, err error) { panic("unimplemented") }

// List returns up to limit blocks of ns ("" = all), most recent first.
func (s *Store) List(ns string, limit int) (infos []Info, truncated bool) { panic("unimplemented") }

// Read copies the block's bytes (slot order) into w chunk by chunk while
// holding a pin.
func (s *Store) Read(key Key, w func(chunk []byte) error) (Info, error) { panic("unimplemented") }

func (s *Store) Stats() Stats { panic("unimplemented") }
