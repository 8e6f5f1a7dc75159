package requester

import (
	"context"
	"fmt"

	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/store"
)

// The engine depends on small interfaces over the connection manager and
// the store, so unit tests can inject fakes; New adapts the real ones.

// reader is one connection to a peer: what a fetch needs of
// *conn.AddrConnection.
type reader interface {
	// Read runs ops; after an error it returns only once no QP can still
	// write into the ops' local memory.
	Read(ctx context.Context, ops []conn.ReadOp) error
}

// connector hands out connections: what a fetch needs of *conn.Dialer.
type connector interface {
	Get(ctx context.Context, peer string) (reader, error)
	Invalidate(r reader, reason error)
}

// reconnecter is a peer client whose gRPC channel can be told to connect
// now, skipping its reconnect backoff, and waited for until it is ready
// (peer.Clients' clients are: peer.Reconnecter).
type reconnecter interface {
	Reconnect(ctx context.Context) error
}

// extent is a staging allocation in local pool memory.
type extent interface {
	// Addr is the virtual address of the first byte (what READs target).
	Addr() uint64
	// Len is the usable length (at least what was asked for).
	Len() uint64
}

// blockStore is what a fetch needs of *store.Store.
type blockStore interface {
	Has(key store.Key) bool
	// AllocStaging allocates n bytes (evicting blocks as needed).
	AllocStaging(n uint64) (extent, error)
	// MaxStaging is the largest allocation AllocStaging can ever satisfy
	// (on a NUMA-split pool: one part).
	MaxStaging() uint64
	// ReleaseStaging drops the fetch's reference to x.
	ReleaseStaging(x extent)
	// Insert indexes key, a block fetched from a peer that holds it too,
	// with slots inside x (taking its own reference): the store's policy
	// evicts such copies first (store.InsertFetched).
	Insert(key store.Key, x extent, slots []store.SlotLayout) (created bool, err error)
	// Hold pins key, an indexed block, so no allocation evicts it until
	// release; size is its bytes. ok is false when it is not indexed.
	Hold(key store.Key) (release func(), size uint64, ok bool)
}

// stagingPlanner is a reader that places staging by NUMA node
// (*conn.AddrConnection); a fetch over one stages on the node of the NIC
// that reads it. Readers without it stage anywhere.
type stagingPlanner interface {
	StagingPlan() *conn.StagingPlan
}

// nodeStore is a blockStore that can place staging on a NUMA node.
type nodeStore interface {
	// AllocStagingOn is AllocStaging on node where it has room there.
	AllocStagingOn(node int, n uint64) (extent, error)
}

// dialerConns adapts *conn.Dialer.
type dialerConns struct{ d *conn.Dialer }

func (c dialerConns) Get(ctx context.Context, peer string) (reader, error) {
	ac, err := c.d.Get(ctx, peer)
	if err != nil {
		return nil, err
	}
	return ac, nil // never a typed nil in the interface
}

func (c dialerConns) Invalidate(r reader, reason error) {
	if ac, ok := r.(*conn.AddrConnection); ok && ac != nil {
		c.d.Invalidate(ac, reason)
	}
}

// storeAdapter adapts *store.Store.
type storeAdapter struct{ s *store.Store }

type storeExtent struct {
	e    *store.Extent
	addr uint64
	n    uint64
}

func (x *storeExtent) Addr() uint64 { return x.addr }
func (x *storeExtent) Len() uint64  { return x.n }

func (a storeAdapter) Has(key store.Key) bool { return a.s.Has(key) }

func (a storeAdapter) AllocStaging(n uint64) (extent, error) { return a.AllocStagingOn(-1, n) }

func (a storeAdapter) MaxStaging() uint64 { return a.s.Pool().MaxAlloc() }

// AllocStagingOn: node < 0 places the staging anywhere.
func (a storeAdapter) AllocStagingOn(node int, n uint64) (extent, error) {
	e, err := a.s.AllocExtentOn(node, n)
	if err != nil {
		return nil, err
	}
	al := e.Alloc()
	return &storeExtent{e: e, addr: a.s.Pool().Addr(al), n: al.Len}, nil
}

func (a storeAdapter) ReleaseStaging(x extent) { a.s.ReleaseExtent(x.(*storeExtent).e) }

// Hold pins one key at a time: a pin of several keys is a chain lookup
// to the eviction policy (store.Pin learns parent hints from it), and the
// blocks a prefetch found local need not be one. A pin counts as an
// access, as the engine's use of the block about to follow would.
func (a storeAdapter) Hold(key store.Key) (func(), uint64, bool) {
	pinned, _ := a.s.Pin([]store.Key{key})
	if len(pinned) == 0 {
		return nil, 0, false
	}
	return func() { a.s.Unpin(pinned) }, pinned[0].Size(), true
}

func (a storeAdapter) Insert(key store.Key, x extent, slots []store.SlotLayout) (bool, error) {
	se, ok := x.(*storeExtent)
	if !ok {
		return false, fmt.Errorf("requester: foreign extent %T", x)
	}
	return a.s.InsertFetched(key, se.e, slots)
}
