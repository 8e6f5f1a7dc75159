package localwire

import (
	"encoding/binary"
	"fmt"
)

// Version 4: NUMA placement. The HELLO reply lists the pool's parts (one
// per NUMA node it is split over, in address order), and ALLOC_ON is
// ALLOC with a preferred node per item: a client copying from a device on
// node n asks for room on n's part, where the pool has one.

// NoNode in an ALLOC_ON item asks for no node (as ALLOC); in a Part, a
// part bound to no node.
const NoNode int32 = -1

// MaxNode is the largest NUMA node id a daemon accepts (Linux's
// MAX_NUMNODES is at most 1 << 10); an ALLOC_ON item naming a node outside
// NoNode..MaxNode is refused with StatusInvalid.
const MaxNode = 1023

// MaxParts bounds the parts of a HELLO reply.
const MaxParts = 1 << 10

// Part is one NUMA part of the pool: [Off, Off+Len) on Node (NoNode: not
// bound to one).
type Part struct {
	Node     int32
	Off, Len uint64
}

// AllocOnItem is one ALLOC_ON item: an ALLOC item and the node its room is
// wanted on (NoNode: any).
type AllocOnItem struct {
	Node int32
	AllocItem
}

// partLen is one encoded Part.
const partLen = 4 + 8 + 8

// appendParts appends a version-4 HELLO reply's parts.
func appendParts(b []byte, parts []Part) []byte {
	b = binary.LittleEndian.AppendUint16(b, uint16(len(parts)))
	for _, p := range parts {
		b = binary.LittleEndian.AppendUint32(b, uint32(p.Node))
		b = binary.LittleEndian.AppendUint64(b, p.Off)
		b = binary.LittleEndian.AppendUint64(b, p.Len)
	}
	return b
}

// parts reads a version-4 HELLO reply's parts and checks that they tile
// [0, poolSize) in order, each non-empty, on NoNode or a node id.
func (r *reader) parts(poolSize uint64) []Part {
	n := int(r.u16("part count"))
	if r.err != nil {
		return nil
	}
	if n == 0 || n > MaxParts || len(r.b) < n*partLen {
		r.err = fmt.Errorf("%w: %d pool parts in %d bytes", ErrMalformed, n, len(r.b))
		return nil
	}
	out := make([]Part, n)
	var end uint64
	for i := range out {
		p := Part{Node: int32(r.u32("part node")), Off: r.u64("part offset"), Len: r.u64("part length")}
		if p.Node < NoNode || p.Node > MaxNode || p.Off != end || p.Len == 0 || p.Len > poolSize-end {
			r.err = fmt.Errorf("%w: pool part %d on node %d at [%d,+%d) does not follow [0,%d) in a pool of %d",
				ErrMalformed, i, p.Node, p.Off, p.Len, end, poolSize)
			return nil
		}
		end += p.Len
		out[i] = p
	}
	if end != poolSize {
		r.err = fmt.Errorf("%w: pool parts cover %d of %d bytes", ErrMalformed, end, poolSize)
		return nil
	}
	return out
}

// AppendAllocOnItem appends one ALLOC_ON request item.
func AppendAllocOnItem(b []byte, it AllocOnItem) []byte {
	b = binary.LittleEndian.AppendUint32(b, uint32(it.Node))
	return AppendAllocItem(b, it.AllocItem)
}

// DecodeAllocOnItems decodes the count items of an ALLOC_ON body. Nodes
// and sizes are not checked: that is the daemon's business.
func DecodeAllocOnItems(body []byte, count int) ([]AllocOnItem, error) {
	r := reader{b: body}
	out := make([]AllocOnItem, 0, min(count, MaxBatch))
	for range count {
		node := int32(r.u32("node"))
		if r.err != nil {
			return nil, r.err
		}
		it, err := r.allocItem()
		if err != nil {
			return nil, err
		}
		out = append(out, AllocOnItem{Node: node, AllocItem: it})
	}
	return out, r.done()
}
