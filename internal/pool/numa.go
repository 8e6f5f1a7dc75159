package pool

import (
	"fmt"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// NUMA placement. A node's NICs read fastest into (and out of) memory on
// their own node, so the pool is split into one part per node that has
// NICs (Options.Nodes), each bound to its node with mbind(MPOL_BIND) before
// it is populated. The memfd stays one file: the binding is the shared
// policy of its pages, which every mapping of it (local clients' too)
// sees. Allocations never straddle two parts, and each records the node
// its part was found on after populating, not the node it was asked for.

// MemPolicy binds ranges of the pool to NUMA nodes and says which node
// backs a page. The kernel's (mbind, get_mempolicy) unless Options.Policy
// says otherwise: tests describe a topology this host does not have.
type MemPolicy interface {
	// Bind sets MPOL_BIND to node on mem's pages, before they are touched.
	Bind(mem []byte, node int) error
	// NodeOf is the node backing the (populated) page at addr.
	NodeOf(addr uint64) int
}

// mpolBind is MPOL_BIND (linux/mempolicy.h).
const mpolBind = 2

// kernelPolicy is the kernel's MemPolicy.
type kernelPolicy struct{}

// Bind calls mbind(2) with MPOL_BIND and a nodemask holding node only.
func (kernelPolicy) Bind(mem []byte, node int) error {
	if len(mem) == 0 {
		return nil
	}
	if node < 0 || node >= 1<<16 {
		return fmt.Errorf("pool: mbind: node %d out of range", node)
	}
	mask := make([]uint64, node/64+1)
	mask[node/64] = 1 << (node % 64)
	// maxnode counts one past the mask's bits: the kernel drops the last
	// (numactl passes the same).
	maxnode := uintptr(len(mask)*64 + 1)
	_, _, errno := unix.Syscall6(unix.SYS_MBIND, uintptr(unsafe.Pointer(&mem[0])), uintptr(len(mem)),
		mpolBind, uintptr(unsafe.Pointer(&mask[0])), maxnode, 0)
	if errno != 0 {
		return fmt.Errorf("pool: mbind %d bytes to node %d: %w", len(mem), node, errno)
	}
	return nil
}

func (kernelPolicy) NodeOf(addr uint64) int { return numaOfMem(addr) }

// part is one node's share of the pool: [off, off+len), on node.
type part struct {
	off, len uint64
	node     int
}

// splitParts divides size bytes (a multiple of page) into one part per
// distinct node of nodes, in the order given, each a whole number of
// pages, the last taking the remainder; fewer parts (at least one, on the
// first node) when the pool has less than a page per node. No nodes: one part on node -1
// (unbound; New records where it really is).
func splitParts(size, page uint64, nodes []int) []part {
	var uniq []int
	for _, n := range nodes {
		if n >= 0 && !slices.Contains(uniq, n) {
			uniq = append(uniq, n)
		}
	}
	if len(uniq) == 0 {
		return []part{{0, size, -1}}
	}
	pages := size / page
	if uint64(len(uniq)) > pages {
		// A pool smaller than a page per node: one part per page it has,
		// and one part on the first node when it has not even one page
		// (a 1 MiB pool over 2 MiB THP units).
		uniq = uniq[:max(pages, 1)]
	}
	per := pages / uint64(len(uniq)) * page
	parts := make([]part, len(uniq))
	var off uint64
	for i, n := range uniq {
		l := per
		if i == len(uniq)-1 {
			l = size - off
		}
		parts[i] = part{off, l, n}
		off += l
	}
	return parts
}

// bindParts binds every part with a node to it. A refusal (a container's
// seccomp filter, a node that is not online) is not fatal: the part stays
// where the kernel puts it, New records that and logs the error.
func bindParts(pol MemPolicy, mem []byte, parts []part) []error {
	errs := make([]error, len(parts))
	for i, pt := range parts {
		if pt.node >= 0 {
			errs[i] = pol.Bind(mem[pt.off:pt.off+pt.len], pt.node)
		}
	}
	return errs
}

// partOf is the index of the part holding offset off (len(parts)-1 past the
// end).
func (p *Pool) partOf(off uint64) int {
	i, _ := slices.BinarySearchFunc(p.parts, off, func(pt part, off uint64) int {
		switch {
		case pt.off+pt.len <= off:
			return -1
		case pt.off > off:
			return 1
		}
		return 0
	})
	return min(i, len(p.parts)-1)
}

// partStart reports whether off is where a part other than the first
// begins: free ranges on either side of it are never merged.
func (p *Pool) partStart(off uint64) bool {
	if len(p.parts) == 1 || off == 0 {
		return false
	}
	i := p.partOf(off)
	return p.parts[i].off == off
}

// Boundary reports whether off is where one NUMA part of the pool ends and
// the next begins: no allocation spans it and free ranges on its two sides
// never merge (an evictor predicting free runs must not merge them either).
func (p *Pool) Boundary(off uint64) bool { return p.partStart(off) }

// MaxAlloc is the largest allocation the pool can ever hold: its largest
// part.
func (p *Pool) MaxAlloc() uint64 {
	var m uint64
	for _, pt := range p.parts {
		m = max(m, pt.len)
	}
	return m
}

// Nodes are the NUMA nodes of the pool's parts, in address order, as found
// after populating (one entry per part; the nodes asked for in
// Options.Nodes where the binding held).
func (p *Pool) Nodes() []int {
	out := make([]int, len(p.parts))
	for i, pt := range p.parts {
		out[i] = pt.node
	}
	return out
}

// NodeOf is the NUMA node of the part holding the virtual address addr, -1
// when addr is outside the pool.
func (p *Pool) NodeOf(addr uint64) int {
	if addr < p.base || addr-p.base >= p.size {
		return -1
	}
	return p.parts[p.partOf(addr-p.base)].node
}

// AllocOn is Alloc from a part on NUMA node node, or, when none of them has
// room, from any part (a.NUMA says where it landed): falling back beats
// evicting blocks to keep a node's share. ErrNoSpace when nothing fits.
func (p *Pool) AllocOn(node int, n uint64) (Alloc, error) {
	return p.alloc(n, node)
}
