package client

import (
	"context"
	"fmt"

	"github.com/pegaflow/pegad/api/localwire"
)

// NUMA placement (data protocol version 4). A process copying blocks from
// a device on one NUMA node (a GPU, a NIC) copies fastest into pool memory
// on that node: with WithNUMANode, Alloc and AllocBatch ask the daemon
// for room on that node's part of the pool, which it gives where that part
// has room, else elsewhere (counted in pegaflow_pool_numa_fallback_total).
// A daemon older than version 4 places blocks as it always did.

// NoNUMANode is WithNUMANode's "no preference".
const NoNUMANode = -1

// WithNUMANode makes Alloc and AllocBatch ask for room on NUMA node node
// (NoNUMANode: anywhere, the default). Dial refuses a node outside
// NoNUMANode..1023 with ErrInvalid; a node the pool has no part on is not
// an error (the daemon places the blocks elsewhere).
func WithNUMANode(node int) Option {
	return func(o *options) { o.node, o.nodeSet = node, true }
}

// checkNUMANode validates WithNUMANode's node.
func checkNUMANode(node int) error {
	if node < int(localwire.NoNode) || node > localwire.MaxNode {
		return fmt.Errorf("%w: NUMA node %d (want %d for none, or 0..%d)", ErrInvalid, node, NoNUMANode, localwire.MaxNode)
	}
	return nil
}

// PoolPart is one NUMA part of the daemon's pool: [Off, Off+Len) of the
// mapping, on Node (NoNUMANode: bound to none).
type PoolPart struct {
	Node     int
	Off, Len uint64
}

// PoolParts are the daemon's pool parts, in address order, as its HELLO
// told them; nil from a daemon older than protocol version 4.
func (c *Client) PoolParts(ctx context.Context) ([]PoolPart, error) {
	if c.data == nil {
		return nil, ErrNoZeroCopy
	}
	d, err := c.data.get(ctx)
	if err != nil {
		return nil, err
	}
	return append([]PoolPart(nil), d.parts...), nil
}

// poolParts converts a HELLO reply's parts.
func poolParts(ps []localwire.Part) []PoolPart {
	if ps == nil {
		return nil
	}
	out := make([]PoolPart, len(ps))
	for i, p := range ps {
		out[i] = PoolPart{Node: int(p.Node), Off: p.Off, Len: p.Len}
	}
	return out
}
