package localdata

import (
	"errors"
	"fmt"

	"github.com/pegaflow/pegad/api/localwire"
	"github.com/pegaflow/pegad/internal/lease"
	"github.com/pegaflow/pegad/internal/store"
)

// key checks a wire key against the store's limits, once: the store
// trusts the CheckedKey it returns.
func key(k localwire.Key) (store.CheckedKey, error) {
	return store.CheckKey(store.Key{Namespace: k.Namespace, Hash: string(k.Hash)})
}

// keyAndLayout checks an ALLOC or PUT item's key and slots (both refused
// with status invalid).
func keyAndLayout(k localwire.Key, slots []localwire.SlotSize) (store.CheckedKey, []store.SlotLayout, uint64, error) {
	ck, err := key(k)
	if err != nil {
		return store.CheckedKey{}, nil, 0, err
	}
	lay, total, err := layout(slots)
	return ck, lay, total, err
}

// layout places the slots contiguously (slot 0 K, slot 0 V, slot 1 K, ...)
// and returns the block's size.
func layout(slots []localwire.SlotSize) ([]store.SlotLayout, uint64, error) {
	if len(slots) == 0 || len(slots) > store.MaxSlots {
		return nil, 0, fmt.Errorf("%d slots (want 1..%d)", len(slots), store.MaxSlots)
	}
	out := make([]store.SlotLayout, len(slots))
	var total uint64
	for i, s := range slots {
		if s.K == 0 {
			return nil, 0, fmt.Errorf("slot %d has an empty K segment", i)
		}
		if s.K > store.MaxBlockLen || s.V > store.MaxBlockLen {
			return nil, 0, fmt.Errorf("slot %d is larger than %d bytes", i, uint64(store.MaxBlockLen))
		}
		out[i] = store.SlotLayout{KOff: total, KLen: s.K}
		total += s.K
		if s.V > 0 {
			out[i].VOff, out[i].VLen = total, s.V
			total += s.V
		}
		if total > store.MaxBlockLen {
			return nil, 0, fmt.Errorf("block is larger than %d bytes", uint64(store.MaxBlockLen))
		}
	}
	return out, total, nil
}

// statusOf maps an error to a wire status.
func statusOf(err error) localwire.Status {
	switch {
	case errors.Is(err, store.ErrNoSpace):
		return localwire.StatusPoolFull
	case errors.Is(err, store.ErrNotFound):
		return localwire.StatusNotFound
	case errors.Is(err, store.ErrInvalid):
		return localwire.StatusInvalid
	case errors.Is(err, lease.ErrLimit):
		return localwire.StatusLimit
	case errors.Is(err, lease.ErrNoLease):
		return localwire.StatusNoLease
	}
	return localwire.StatusInternal
}

// open gives h to the connection as a lease; on failure the caller gives
// back what h holds.
func (cn *conn) open(h held) (lease.ID, error) {
	id, err := cn.owner.Open(h)
	if err != nil && errors.Is(err, lease.ErrNoLease) {
		return 0, fmt.Errorf("%w: server closing", err)
	}
	return id, err
}

// alloc answers ALLOC: room for each block and a write lease on it.
func (cn *conn) alloc(b []byte, items []localwire.AllocItem) []byte {
	for i := range items {
		b = cn.allocOne(b, &items[i], localwire.NoNode)
	}
	return b
}

// allocOne answers one ALLOC or ALLOC_ON item: room for the block, on
// node's part of the pool where it has room (NoNode: anywhere), and a
// write lease on it.
func (cn *conn) allocOne(b []byte, it *localwire.AllocItem, node int32) []byte {
	st := cn.s.store
	if err := checkNode(node); err != nil {
		return localwire.AppendError(b, localwire.StatusInvalid, err.Error())
	}
	k, lay, total, err := keyAndLayout(it.Key, it.Slots)
	if err != nil {
		return localwire.AppendError(b, localwire.StatusInvalid, err.Error())
	}
	if st.Has(k.Key()) {
		return localwire.AppendError(b, localwire.StatusExists, "block already stored")
	}
	id, ext, err := cn.openExtentOn(int(node), total, held{key: k, layout: lay})
	if err != nil {
		return localwire.AppendError(b, statusOf(err), err.Error())
	}
	return localwire.AppendResult(b, localwire.OpAlloc, &localwire.Result{
		Lease: uint64(id), Seg: localwire.Segment{Off: ext.Alloc().Off, Len: total},
	})
}

// lease answers LEASE: pins every found block (one store call) and gives a
// read lease on each.
func (cn *conn) lease(b []byte, keys []localwire.Key) []byte {
	st := cn.s.store
	valid := make([]store.Key, 0, len(keys))
	bad := make([]error, len(keys))
	for i, wk := range keys {
		k, err := key(wk)
		if err != nil {
			bad[i] = err
			continue
		}
		valid = append(valid, k.Key())
	}
	pinned, missing := st.Pin(valid)
	// Walk keys in order, matching them with the pinned blocks (in order)
	// and the missing indexes (of valid, ascending).
	var vi, pi, mi int
	budget := localwire.MaxFrame - len(b) - 4
	for i := range keys {
		if bad[i] != nil {
			b = localwire.AppendError(b, localwire.StatusInvalid, bad[i].Error())
			budget -= 3 + len(bad[i].Error())
			continue
		}
		if mi < len(missing) && missing[mi] == vi {
			mi++
			vi++
			b = localwire.AppendError(b, localwire.StatusNotFound, "block not found")
			budget -= 3 + len("block not found")
			continue
		}
		vi++
		blk := pinned[pi]
		pi++
		nslots := blk.NumSlots()
		// Keep room for the error results of every item after this one.
		if need := localwire.LeaseResultLen(nslots) + 64*(len(keys)-i); need > budget {
			st.Unpin([]*store.Block{blk})
			b = localwire.AppendError(b, localwire.StatusLimit, "response too large: lease fewer blocks per call")
			budget -= 3 + 48
			continue
		}
		id, err := cn.open(held{block: blk})
		if err != nil {
			st.Unpin([]*store.Block{blk})
			b = localwire.AppendError(b, statusOf(err), err.Error())
			budget -= 3 + len(err.Error())
			continue
		}
		// The places go through the connection's scratch slice, read from
		// the block without a copy: encoding an answer allocates nothing
		// per block.
		cn.slots = cn.slots[:0]
		for j := range nslots {
			s := blk.Slot(j)
			cn.slots = append(cn.slots, localwire.SlotPlace{
				K: localwire.Segment{Off: s.K.Off, Len: s.K.Len},
				V: localwire.Segment{Off: s.V.Off, Len: s.V.Len},
			})
		}
		if cn.s.engine != nil {
			cn.s.engine.Load(blk.Key().Namespace, blk.Size())
		}
		res := localwire.Result{Lease: uint64(id), Slots: cn.slots}
		n := len(b)
		b = localwire.AppendResult(b, localwire.OpLease, &res)
		budget -= len(b) - n
	}
	return b
}

// finish answers one item of COMMIT, ABORT, RELEASE or RENEW. A lease of
// the wrong kind for the op is left alone and answered NO_LEASE.
func (cn *conn) finish(b []byte, op localwire.Op, id lease.ID) []byte {
	st := cn.s.store
	if op == localwire.OpRenew {
		if err := cn.owner.Renew(id); err != nil {
			return localwire.AppendError(b, statusOf(err), err.Error())
		}
		return localwire.AppendResult(b, op, &localwire.Result{})
	}
	// One lease-table operation checks the kind and ends the lease.
	h, err := cn.owner.TakeIf(id, func(h held) error {
		switch k := h.kind(); {
		case op == localwire.OpCommit && k == kindWrite,
			op == localwire.OpAbort && k != kindRead,
			op == localwire.OpRelease && k == kindRead:
			return nil
		default:
			return wrongKind{id: id, kind: k}
		}
	})
	if err != nil {
		return localwire.AppendError(b, statusOf(err), err.Error())
	}
	var res localwire.Result
	switch op {
	case localwire.OpCommit:
		if res.Created, err = cn.insert(h, h.key, h.layout); err != nil {
			return localwire.AppendError(b, localwire.StatusInternal, err.Error())
		}
		if res.Created {
			cn.s.saved(h.key.Key().Namespace, layoutSize(h.layout))
		}
	case localwire.OpAbort:
		st.ReleaseExtent(h.ext)
	case localwire.OpRelease:
		st.Unpin([]*store.Block{h.block})
	}
	return localwire.AppendResult(b, op, &res)
}

// wrongKind: a lease finished by an op of another kind (it stays live).
type wrongKind struct {
	id   lease.ID
	kind kind
}

func (e wrongKind) Error() string {
	return fmt.Sprintf("%v: lease %d is a %v lease", lease.ErrNoLease, e.id, e.kind)
}

func (e wrongKind) Unwrap() error { return lease.ErrNoLease }

// reserve takes n bytes of room and a reservation lease on them.
func (cn *conn) reserve(n uint64) (lease.ID, *store.Extent, error) {
	if n == 0 || n > store.MaxBlockLen {
		return 0, nil, fmt.Errorf("%w: reservation of %d bytes (want 1..%d)", store.ErrInvalid, n, uint64(store.MaxBlockLen))
	}
	return cn.openExtentOn(-1, n, held{size: n})
}

// openExtentOn allocates n bytes, on node's part of the pool where it has
// room (node < 0: anywhere), and opens lease h on them (ALLOC's write
// lease, RESERVE's reservation); the room goes back when the lease cannot
// be opened.
func (cn *conn) openExtentOn(node int, n uint64, h held) (lease.ID, *store.Extent, error) {
	// An ALLOC names its namespace, whose quota decides (a reservation
	// names none: its block is accounted when PUT inserts it).
	ext, err := cn.s.store.AllocExtentFor(node, h.key.Key().Namespace, n)
	if err != nil {
		return 0, nil, err
	}
	cn.s.placed(node, ext.Alloc().NUMA)
	h.ext = ext
	id, err := cn.open(h)
	if err != nil {
		cn.s.store.ReleaseExtent(ext)
		return 0, nil, err
	}
	return id, ext, nil
}

// reserveResult answers one RESERVE item.
func (cn *conn) reserveResult(b []byte, n uint64) []byte {
	id, ext, err := cn.reserve(n)
	if err != nil {
		return localwire.AppendError(b, statusOf(err), err.Error())
	}
	return localwire.AppendResult(b, localwire.OpReserve, &localwire.Result{
		Lease: uint64(id), Seg: localwire.Segment{Off: ext.Alloc().Off, Len: n},
	})
}

// insert makes the room of h, a lease already taken from the table, the
// block k (COMMIT of an ALLOC lease, PUT of a reservation), and gives the
// lease's reference to the room back either way. Callers answer a failure
// with status internal, never invalid: the lease is over, and status
// invalid tells a PUT's client that its reservation is still its own.
// The key and layout were checked before the lease was taken, so a
// failure here is a daemon bug.
func (cn *conn) insert(h held, k store.CheckedKey, lay []store.SlotLayout) (bool, error) {
	created, err := cn.s.insert(k, h.ext, lay)
	cn.s.store.ReleaseExtent(h.ext) // Insert took its own reference
	if err != nil {
		return false, fmt.Errorf("%w (the lease has ended)", err)
	}
	return created, nil
}

// put answers one PUT item: the reservation becomes the block (as COMMIT
// of an ALLOC lease), then a new reservation is taken for the client's
// next Put. A key or layout the daemon refuses leaves the reservation as
// it was (status invalid); a reservation that is not live is NO_LEASE;
// a failure once it was taken (status internal) ends it.
func (cn *conn) put(b []byte, it *localwire.PutItem) []byte {
	k, lay, total, err := keyAndLayout(it.Key, it.Slots)
	if err != nil {
		return localwire.AppendError(b, localwire.StatusInvalid, err.Error())
	}
	id := lease.ID(it.ID)
	h, err := cn.owner.TakeIf(id, func(h held) error {
		if k := h.kind(); k != kindReserved {
			return wrongKind{id: id, kind: k}
		}
		if h.size != total {
			return sizeMismatch{block: total, room: h.size}
		}
		return nil
	})
	if err != nil {
		return localwire.AppendError(b, statusOf(err), err.Error())
	}
	var res localwire.Result
	if res.Created, err = cn.insert(h, k, lay); err != nil {
		return localwire.AppendError(b, localwire.StatusInternal, err.Error())
	}
	if res.Created {
		cn.s.saved(k.Key().Namespace, total)
	}
	if it.Next > 0 {
		next, ext, err := cn.reserve(it.Next)
		if err != nil {
			res.Next = statusOf(err)
		} else {
			res.Lease, res.Seg = uint64(next), localwire.Segment{Off: ext.Alloc().Off, Len: it.Next}
		}
	}
	return localwire.AppendResult(b, localwire.OpPut, &res)
}

// sizeMismatch: a PUT whose block is not the size of its reservation (the
// reservation stays live).
type sizeMismatch struct{ block, room uint64 }

func (e sizeMismatch) Error() string {
	return fmt.Sprintf("%v: block of %d bytes in a reservation of %d", store.ErrInvalid, e.block, e.room)
}

func (e sizeMismatch) Unwrap() error { return store.ErrInvalid }

// saved counts a new block's bytes on the engine metrics.
func (s *Server) saved(ns string, n uint64) {
	if s.engine != nil {
		s.engine.Save(ns, n)
	}
}

// layoutSize is the bytes a block of this layout takes (slots lie
// contiguously from 0).
func layoutSize(lay []store.SlotLayout) uint64 {
	var n uint64
	for _, l := range lay {
		n = max(n, l.KOff+l.KLen, l.VOff+l.VLen)
	}
	return n
}
