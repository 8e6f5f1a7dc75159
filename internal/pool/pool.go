// Package pool owns pegad's pinned host-memory region: one mmap'd, populated
// and (where RLIMIT_MEMLOCK allows) mlock'ed region, and an allocator of
// variable-size ranges inside it. Every allocation records its NUMA node.
//
// The pool never knows what its bytes mean (blocks, staging); it must never
// hand the same byte to two live allocations, and never free twice.
//
// API CONTRACT (implementation pending; signatures are fixed):
package pool

import (
	"errors"

	"github.com/rs/zerolog"
)

var (
	// ErrNoSpace: no free range large enough (after the caller's eviction).
	ErrNoSpace = errors.New("pool: no space")
	// ErrInvalid: zero or oversized request, unknown/double free.
	ErrInvalid = errors.New("pool: invalid allocation")
)

// Alignment of every allocation's offset and length (bytes).
const Alignment = 64

// Options configure New.
type Options struct {
	Size uint64 // bytes; rounded up to the page size
	// Lock asks for mlock; when the limit refuses, New logs a warning
	// naming LimitMEMLOCK / ulimit -l and continues unlocked.
	Lock bool
	Log  zerolog.Logger
}

// Alloc is one allocation: [Off, Off+Len) inside the pool.
type Alloc struct {
	Off  uint64
	Len  uint64
	NUMA int
}

// Stats is a snapshot of the pool.
type Stats struct {
	Size, Used, Free, LargestFree uint64
	Allocs                        int
	Locked                        bool
}

// Pool is safe for concurrent use.
type Pool struct{}

func New(opts Options) (*Pool, error) { panic("unimplemented") }

// Bytes is the whole region, for memory registration.
func (p *Pool) Bytes() []byte { panic("unimplemented") }

// Base is the virtual address of the region's first byte.
func (p *Pool) Base() uint64 { panic("unimplemented") }
func (p *Pool) Size() uint64 { panic("unimplemented") }
func (p *Pool) Locked() bool { panic("unimplemented") }

// Alloc returns n bytes (rounded up to Alignment). ErrNoSpace when no free
// range fits; ErrInvalid when n == 0 or n > Size.
func (p *Pool) Alloc(n uint64) (Alloc, error) { panic("unimplemented") }

// Free returns a to the pool; ErrInvalid for an allocation that is not live.
func (p *Pool) Free(a Alloc) error { panic("unimplemented") }

// Slice is the memory of a (or of a sub-range: use Slice(a)[i:j]).
func (p *Pool) Slice(a Alloc) []byte { panic("unimplemented") }

// Addr is the virtual address of a's first byte.
func (p *Pool) Addr(a Alloc) uint64 { panic("unimplemented") }
func (p *Pool) Stats() Stats        { panic("unimplemented") }

// Close unmaps the region. Only after everything using it is gone.
func (p *Pool) Close() error { panic("unimplemented") }
