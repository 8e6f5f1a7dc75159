// Package pool owns pegad's pinned host-memory region: one memfd, mapped
// MAP_SHARED, populated (in parallel, failures reported) and (where
// RLIMIT_MEMLOCK allows) mlock'ed, and an allocator of variable-size ranges
// inside it. The region is split into one part per NUMA node that has NICs,
// each bound to its node (numa.go); every allocation lies in one part and
// records that part's node. The memfd (FD) is what
// local clients map to read and write blocks in place; handing it to them
// is the local data socket's job, not the pool's.
//
// The pool never knows what its bytes mean (blocks, staging); it must never
// hand the same byte to two live allocations, and never free twice.
//
// Allocator: an address-ordered free list (a slice of disjoint free ranges
// sorted by offset) searched first-fit, with immediate coalescing on Free.
// Address-ordered first fit is the classic low-fragmentation policy (Wilson et
// al., "Dynamic Storage Allocation: A Survey"): it packs allocations toward
// the low end and leaves the large free range at the high end, which is what a
// pool that mixes block-sized extents with 256 MiB staging extents needs.
// Alloc is O(F) and Free O(log F + F) (a memmove) with F = free fragments.
package pool

import (
	"errors"
	"fmt"
	"sort"
	"sync"
	"unsafe"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
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
	// HugePages is none (""), thp, 2M or 1G (hugepages.go).
	HugePages string
	// Nodes are the NUMA nodes to spread the pool over, one part each
	// (those of the NICs; duplicates and negative nodes are ignored).
	// Empty: one part, left where the kernel puts it.
	Nodes []int
	// Policy binds parts to nodes and locates pages; nil: the kernel's.
	Policy MemPolicy
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
	// FreeSpans counts the free ranges: 1 for an empty pool, more as
	// free room splits between live allocations (fragmentation).
	FreeSpans int
	Locked    bool
}

// PartStats is one NUMA part's share of the pool.
type PartStats struct {
	Node       int // -1: no node (a pool not split over nodes)
	Size, Used uint64
}

// span is a free range [off, off+len).
type span struct{ off, len uint64 }

// Pool is safe for concurrent use.
type Pool struct {
	// Immutable after New.
	base   uint64
	size   uint64
	locked bool
	// parts: the NUMA parts, in address order, covering [0, size).
	parts []part

	mu sync.Mutex // guards mem (nil after Close), fd, free, live, used, partUsed
	// mem is the mapped region; nil once closed.
	mem []byte
	// fd is the memfd behind mem; -1 once closed.
	fd int
	// free holds the disjoint free ranges sorted by offset, none
	// adjacent to another except across a part boundary.
	free []span
	// live maps the offset of every live allocation to its length: the
	// authority Free checks against (double free, foreign ranges).
	live map[uint64]uint64
	used uint64
	// partUsed is used per part (same index as parts).
	partUsed []uint64
}

// Hooks for tests: the mlock call and the NUMA query.
var (
	mlock     = unix.Mlock
	numaOfMem = numaNodeOf
)

// New maps, populates and (when asked and allowed) locks a region of
// opts.Size bytes rounded up to the page size.
func New(opts Options) (*Pool, error) {
	if opts.Size == 0 {
		return nil, fmt.Errorf("%w: size 0", ErrInvalid)
	}
	page := hugePageSize(opts.HugePages)
	size := (opts.Size + page - 1) / page * page
	if size < opts.Size || size > uint64(^uint(0)>>1) {
		return nil, fmt.Errorf("%w: size %d too large", ErrInvalid, opts.Size)
	}
	if err := checkHugePages(opts.HugePages, size); err != nil {
		return nil, err
	}
	split := page
	if opts.HugePages == HugePagesTHP {
		split = 2 << 20 // a part boundary never splits a transparent huge page
	}
	parts := splitParts(size, split, opts.Nodes)
	if err := checkNodeHugePages(opts.HugePages, parts); err != nil {
		return nil, err
	}
	if opts.HugePages == HugePagesTHP {
		logTHPShmem(opts.Log)
	}
	fd, mem, err := mapMemfd(size, opts.HugePages)
	if err != nil {
		return nil, err
	}
	adviseHuge(mem, opts.HugePages)
	pol := opts.Policy
	if pol == nil {
		pol = kernelPolicy{}
	}
	bindErrs := bindParts(pol, mem, parts)                       // before populate: pages land on their node
	if err := populate(mem, populateWorkers(size)); err != nil { // populate.go
		_ = unix.Munmap(mem)
		_ = unix.Close(fd)
		return nil, fmt.Errorf("pool: populate %d bytes: %w", size, err)
	}
	p := &Pool{
		fd:       fd,
		base:     uint64(uintptr(unsafe.Pointer(&mem[0]))),
		size:     size,
		mem:      mem,
		parts:    parts,
		live:     make(map[uint64]uint64),
		partUsed: make([]uint64, len(parts)),
	}
	for i := range p.parts {
		pt := &p.parts[i]
		p.free = append(p.free, span{pt.off, pt.len})
		// Where the part really is, not where it was asked to be.
		asked := pt.node
		pt.node = pol.NodeOf(p.base + pt.off)
		if asked >= 0 && (bindErrs[i] != nil || pt.node != asked) {
			opts.Log.Warn().Err(bindErrs[i]).Int("numa_wanted", asked).Int("numa", pt.node).
				Uint64("part_bytes", pt.len).Msg("pool part is not on the NUMA node of its NICs; READs through them cross sockets")
		}
	}
	if opts.Lock {
		switch err := mlock(mem); {
		case err == nil:
			p.locked = true
		case errors.Is(err, unix.EPERM), errors.Is(err, unix.ENOMEM), errors.Is(err, unix.EAGAIN):
			// Not fatal: the daemon works unlocked, but RDMA registration
			// pins pages anyway and swap can stall reads, so say it loudly.
			ev := opts.Log.Warn().Err(err).Uint64("pool_bytes", size)
			var lim unix.Rlimit
			if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) == nil {
				ev = ev.Uint64("memlock_limit_bytes", lim.Cur)
			}
			ev.Msg("pool is NOT locked in memory (mlock refused by RLIMIT_MEMLOCK); raise the limit: " +
				"LimitMEMLOCK=infinity in the systemd unit, or `ulimit -l unlimited` in the shell")
		default:
			_ = unix.Munmap(mem)
			_ = unix.Close(fd)
			return nil, fmt.Errorf("pool: mlock %d bytes: %w", size, err)
		}
	}
	opts.Log.Info().Uint64("pool_bytes", size).Bool("locked", p.locked).Int("numa", p.parts[0].node).
		Ints("numa_parts", p.Nodes()).Msg("pool mapped")
	return p, nil
}

// mapMemfd creates a memfd of size bytes and maps it shared and populated.
// Shared, so that a local client mapping the same fd sees the same pages.
func mapMemfd(size uint64, hugePages string) (fd int, mem []byte, err error) {
	fd, err = unix.MemfdCreate("pegad-pool", unix.MFD_CLOEXEC|hugeMemfdFlags(hugePages))
	if err != nil {
		return -1, nil, fmt.Errorf("pool: memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		_ = unix.Close(fd)
		return -1, nil, fmt.Errorf("pool: size memfd to %d bytes: %w", size, err)
	}
	// Populated by New, in parallel (populate.go).
	mem, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		_ = unix.Close(fd)
		return -1, nil, fmt.Errorf("pool: mmap %d bytes: %w", size, err)
	}
	return fd, mem, nil
}

// FD is the memfd backing the region, for handing to local clients
// (SCM_RIGHTS duplicates it). Valid until Close; -1 after.
func (p *Pool) FD() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fd
}

// get_mempolicy flags (linux/mempolicy.h).
const (
	mpolFNode = 1 << 0
	mpolFAddr = 1 << 1
)

// numaNodeOf asks the kernel which NUMA node backs the page at addr; 0 when
// the query fails (no NUMA support, seccomp).
func numaNodeOf(addr uint64) int {
	var node int32
	_, _, errno := unix.Syscall6(unix.SYS_GET_MEMPOLICY,
		uintptr(unsafe.Pointer(&node)), 0, 0, uintptr(addr), mpolFNode|mpolFAddr, 0)
	if errno != 0 || node < 0 {
		return 0
	}
	return int(node)
}

// Bytes is the whole region, for memory registration. nil after Close.
func (p *Pool) Bytes() []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.mem
}

// Base is the virtual address of the region's first byte.
func (p *Pool) Base() uint64 { return p.base }
func (p *Pool) Size() uint64 { return p.size }
func (p *Pool) Locked() bool { return p.locked }

// NUMA is the node of the pool's first part (all of it unless split
// over nodes: Nodes).
func (p *Pool) NUMA() int { return p.parts[0].node }

// Used is the number of allocated bytes (cheaper than Stats).
func (p *Pool) Used() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used
}

func roundUp(n uint64) uint64 { return (n + Alignment - 1) &^ (Alignment - 1) }

// Alloc returns n bytes (rounded up to Alignment): first fit in the part
// with the most free bytes, then in the others, so that blocks put with no
// node in mind spread over a split pool's NUMA parts instead of filling
// part 0 first (a fetch then reads from both sockets' memory, not mostly
// across the link). ErrNoSpace when no free range fits; ErrInvalid when
// n == 0 or n > Size.
func (p *Pool) Alloc(n uint64) (Alloc, error) { return p.alloc(n, -1) }

// alloc is first fit over the free ranges on node's parts, then (or, node
// < 0, only) over all of them, the part with the most free bytes first.
func (p *Pool) alloc(n uint64, node int) (Alloc, error) {
	if n == 0 || n > p.size {
		return Alloc{}, fmt.Errorf("%w: %d bytes (pool is %d)", ErrInvalid, n, p.size)
	}
	n = roundUp(n)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mem == nil {
		return Alloc{}, fmt.Errorf("%w: pool closed", ErrInvalid)
	}
	i := -1
	if node >= 0 && len(p.parts) > 1 {
		i = p.firstFit(n, node)
	}
	if i < 0 {
		i = p.fitMostFree(n)
	}
	if i >= 0 {
		f := &p.free[i]
		pi := p.partOf(f.off)
		a := Alloc{Off: f.off, Len: n, NUMA: p.parts[pi].node}
		p.partUsed[pi] += n
		if f.len == n {
			p.free = append(p.free[:i], p.free[i+1:]...)
		} else {
			f.off += n
			f.len -= n
		}
		p.live[a.Off] = n
		p.used += n
		return a, nil
	}
	// The bare sentinel: a full pool is the common case (every ALLOC tries
	// here before it evicts), where formatting an error cost a tenth of
	// the daemon's CPU; the store's error names the size.
	return Alloc{}, ErrNoSpace
}

// fitMostFree is the index of the first free range of at least n bytes in
// the part with the most free bytes that has one (address order breaks
// ties), -1 when none. Caller holds mu.
func (p *Pool) fitMostFree(n uint64) int {
	if len(p.parts) == 1 {
		return p.firstFit(n, -1)
	}
	best, bestFree := -1, uint64(0)
	for i, f := range p.free {
		if f.len < n {
			continue
		}
		pi := p.partOf(f.off)
		if free := p.parts[pi].len - p.partUsed[pi]; best < 0 || free > bestFree {
			best, bestFree = i, free
		}
	}
	return best
}

// firstFit is the index of the first free range of at least n bytes in a
// part on node (any part: node < 0), -1 when none. Caller holds mu.
func (p *Pool) firstFit(n uint64, node int) int {
	for i, f := range p.free {
		if f.len >= n && (node < 0 || p.parts[p.partOf(f.off)].node == node) {
			return i
		}
	}
	return -1
}

// Free returns a to the pool; ErrInvalid for an allocation that is not live.
// Frees are accepted after Close (bookkeeping only).
func (p *Pool) Free(a Alloc) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l, ok := p.live[a.Off]; !ok || l != a.Len {
		return fmt.Errorf("%w: free of [%d,+%d) which is not a live allocation", ErrInvalid, a.Off, a.Len)
	}
	delete(p.live, a.Off)
	p.used -= a.Len
	p.partUsed[p.partOf(a.Off)] -= a.Len
	// i: first free range after a.
	i := sort.Search(len(p.free), func(i int) bool { return p.free[i].off > a.Off })
	end := a.Off + a.Len
	mergeL := i > 0 && p.free[i-1].off+p.free[i-1].len == a.Off && !p.partStart(a.Off)
	mergeR := i < len(p.free) && p.free[i].off == end && !p.partStart(end)
	switch {
	case mergeL && mergeR:
		p.free[i-1].len += a.Len + p.free[i].len
		p.free = append(p.free[:i], p.free[i+1:]...)
	case mergeL:
		p.free[i-1].len += a.Len
	case mergeR:
		p.free[i].off = a.Off
		p.free[i].len += a.Len
	default:
		p.free = append(p.free, span{})
		copy(p.free[i+1:], p.free[i:])
		p.free[i] = span{a.Off, a.Len}
	}
	return nil
}

// FreeAround reports the lengths of the free ranges that touch the live
// allocation a on its left (ending at a.Off) and on its right (starting at
// a.Off+a.Len), 0 where none. An evictor uses it to predict how large a
// contiguous range freeing a would make, before freeing anything.
func (p *Pool) FreeAround(a Alloc) (before, after uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := sort.Search(len(p.free), func(i int) bool { return p.free[i].off > a.Off })
	if i > 0 && p.free[i-1].off+p.free[i-1].len == a.Off && !p.partStart(a.Off) {
		before = p.free[i-1].len
	}
	if i < len(p.free) && p.free[i].off == a.Off+a.Len && !p.partStart(a.Off+a.Len) {
		after = p.free[i].len
	}
	return before, after
}

// Slice is the memory of a (or of a sub-range: use Slice(a)[i:j]). nil
// after Close or for a range outside the pool.
func (p *Pool) Slice(a Alloc) []byte {
	p.mu.Lock()
	mem := p.mem
	p.mu.Unlock()
	if mem == nil || a.Off > p.size || a.Len > p.size-a.Off {
		return nil
	}
	return mem[a.Off : a.Off+a.Len : a.Off+a.Len]
}

// Addr is the virtual address of a's first byte.
func (p *Pool) Addr(a Alloc) uint64 { return p.base + a.Off }

func (p *Pool) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := Stats{Size: p.size, Used: p.used, Free: p.size - p.used, Allocs: len(p.live), FreeSpans: len(p.free), Locked: p.locked}
	for _, f := range p.free {
		s.LargestFree = max(s.LargestFree, f.len)
	}
	return s
}

// PartStats is each NUMA part's size and use, in address order.
func (p *Pool) PartStats() []PartStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]PartStats, len(p.parts))
	for i, pt := range p.parts {
		out[i] = PartStats{Node: pt.node, Size: pt.len, Used: p.partUsed[i]}
	}
	return out
}

// Close unmaps the region. Only after everything using it is gone: a slice
// obtained before Close must not be touched after it. Idempotent.
func (p *Pool) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.mem == nil {
		return nil
	}
	mem := p.mem
	p.mem = nil
	fd := p.fd
	p.fd = -1
	var errs []error
	if err := unix.Munmap(mem); err != nil {
		errs = append(errs, fmt.Errorf("pool: munmap: %w", err))
	}
	if err := unix.Close(fd); err != nil {
		errs = append(errs, fmt.Errorf("pool: close memfd: %w", err))
	}
	return errors.Join(errs...)
}
