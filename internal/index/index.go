// Package index is pegad's view of the cluster index: which live node
// holds which block (docs/cluster.md). It defines what the daemon and the
// requester need from any index (register, announce, withdraw, locate)
// and owns the publisher that keeps this node's entries in step with its
// store.
//
// It never talks to a network itself: a backend (redisindex) does, behind
// Index. The index is a hint: what it says a node holds may be stale by
// the time a requester asks; the holder's QueryBlocksForTransfer stays
// the truth, so a stale entry costs a query that finds fewer blocks,
// never a wrong byte.
package index

import (
	"context"
	"errors"
	"time"

	"github.com/pegaflow/pegad/internal/store"
)

// ErrUnavailable wraps every failure to reach the index (down, timeout,
// refused): callers fail fast and say so instead of waiting for it.
var ErrUnavailable = errors.New("cluster index unavailable")

// ErrDisabled is returned by cluster operations on a node started
// without --cluster-redis.
var ErrDisabled = errors.New("cluster index not configured (start pegad with --cluster-redis)")

// Node is one node's membership record.
type Node struct {
	ID          string    `json:"node_id"`
	Addr        string    `json:"advertise"`
	Incarnation string    `json:"incarnation"`
	Transport   string    `json:"transport"`
	PoolSize    uint64    `json:"pool_size"`
	FreeBytes   uint64    `json:"free_bytes"`
	Started     time.Time `json:"started"`
	// Expires is when the record lapses unless refreshed (set by Nodes).
	Expires time.Time `json:"expires"`
}

// Medium is where a holder keeps a block. A requester that finds several
// holders prefers a DRAM copy: an SSD copy is read back into the holder's
// pool before the transfer (docs/tiering.md).
type Medium string

// Media a node announces.
const (
	MediumDRAM Medium = "dram" // in the pinned pool
	MediumSSD  Medium = "ssd"  // only on the SSD tier (--ssd-path)
)

// Holder is a live node that the index says holds a block.
type Holder struct {
	NodeID      string
	Addr        string
	Incarnation string
	Medium      Medium // MediumDRAM unless the node announced an SSD copy
}

// PreferDRAM returns the holders of hs with the best medium: the DRAM
// ones when there are any, else all of them (SSD copies). It keeps the
// order of hs and may share its backing array.
func PreferDRAM(hs []Holder) []Holder {
	n := 0
	for _, h := range hs {
		if h.Medium != MediumSSD {
			n++
		}
	}
	if n == 0 || n == len(hs) {
		return hs
	}
	out := make([]Holder, 0, n)
	for _, h := range hs {
		if h.Medium != MediumSSD {
			out = append(out, h)
		}
	}
	return out
}

// Index is a cluster index seen from one node (the one it was opened
// for). Every method is bounded by ctx and the backend's own timeouts, and
// wraps ErrUnavailable when the backend cannot be reached.
type Index interface {
	// Register writes or refreshes this node's membership record, which
	// lapses after the index's TTL unless refreshed. lost reports that the
	// index did not have this incarnation's record (first registration,
	// the record expired, the backend restarted empty): what this node
	// announced before may be gone or stale, so the caller must Reset and
	// announce everything again.
	Register(ctx context.Context, self Node) (lost bool, err error)
	// Reset removes every block entry this node announced, under any of
	// its incarnations.
	Reset(ctx context.Context) error
	// Announce records that this node holds keys on medium (replacing
	// what it announced of them before); Withdraw that it no longer does.
	Announce(ctx context.Context, medium Medium, keys []store.Key) error
	Withdraw(ctx context.Context, keys []store.Key) error
	// Locate returns, per hash (same order), the live holders the index
	// knows of: nodes whose record has not lapsed and whose current
	// incarnation is the one that announced the block.
	Locate(ctx context.Context, namespace string, hashes [][]byte) ([][]Holder, error)
	// Nodes lists the live nodes.
	Nodes(ctx context.Context) ([]Node, error)
	// Deregister removes this node's record (clean shutdown), so peers stop
	// asking it at once instead of after the TTL.
	Deregister(ctx context.Context) error
}
