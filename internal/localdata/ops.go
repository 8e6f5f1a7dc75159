package localdata

import (
	"errors"
	"fmt"

	"github.com/pegaflow/pegad/api/localwire"
	"github.com/pegaflow/pegad/internal/lease"
	"github.com/pegaflow/pegad/internal/store"
)

// key checks a wire key against the store's limits.
func key(k localwire.Key) (store.Key, error) {
	switch {
	case k.Namespace == "" || len(k.Namespace) > store.MaxNSLen:
		return store.Key{}, fmt.Errorf("namespace of %d bytes (want 1..%d)", len(k.Namespace), store.MaxNSLen)
	case len(k.Hash) == 0 || len(k.Hash) > store.MaxHashLen:
		return store.Key{}, fmt.Errorf("hash of %d bytes (want 1..%d)", len(k.Hash), store.MaxHashLen)
	}
	return store.Key{Namespace: k.Namespace, Hash: string(k.Hash)}, nil
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
func (cn *conn) open(h *held) (lease.ID, error) {
	id, err := cn.owner.Open(h)
	if err != nil && errors.Is(err, lease.ErrNoLease) {
		return 0, fmt.Errorf("%w: server closing", err)
	}
	return id, err
}

// alloc answers ALLOC: room for each block and a write lease on it.
func (cn *conn) alloc(b []byte, items []localwire.AllocItem) []byte {
	st := cn.s.store
	for _, it := range items {
		k, err := key(it.Key)
		if err != nil {
			b = localwire.AppendError(b, localwire.StatusInvalid, err.Error())
			continue
		}
		lay, total, err := layout(it.Slots)
		if err != nil {
			b = localwire.AppendError(b, localwire.StatusInvalid, err.Error())
			continue
		}
		if st.Has(k) {
			b = localwire.AppendError(b, localwire.StatusExists, "block already stored")
			continue
		}
		ext, err := st.AllocExtent(total)
		if err != nil {
			b = localwire.AppendError(b, statusOf(err), err.Error())
			continue
		}
		id, err := cn.open(&held{key: k, ext: ext, layout: lay})
		if err != nil {
			st.ReleaseExtent(ext)
			b = localwire.AppendError(b, statusOf(err), err.Error())
			continue
		}
		b = localwire.AppendResult(b, localwire.OpAlloc, &localwire.Result{
			Lease: uint64(id), Seg: localwire.Segment{Off: ext.Alloc().Off, Len: total},
		})
	}
	return b
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
		valid = append(valid, k)
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
		slots := blk.Slots()
		// Keep room for the error results of every item after this one.
		if need := localwire.LeaseResultLen(len(slots)) + 64*(len(keys)-i); need > budget {
			st.Unpin([]*store.Block{blk})
			b = localwire.AppendError(b, localwire.StatusLimit, "response too large: lease fewer blocks per call")
			budget -= 3 + 48
			continue
		}
		id, err := cn.open(&held{key: blk.Key(), block: blk})
		if err != nil {
			st.Unpin([]*store.Block{blk})
			b = localwire.AppendError(b, statusOf(err), err.Error())
			budget -= 3 + len(err.Error())
			continue
		}
		res := localwire.Result{Lease: uint64(id), Slots: make([]localwire.SlotPlace, len(slots))}
		for j, s := range slots {
			res.Slots[j] = localwire.SlotPlace{
				K: localwire.Segment{Off: s.K.Off, Len: s.K.Len},
				V: localwire.Segment{Off: s.V.Off, Len: s.V.Len},
			}
		}
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
	h, err := cn.owner.Peek(id)
	if err == nil && h.write() != (op == localwire.OpCommit || op == localwire.OpAbort) {
		err = fmt.Errorf("%w: lease %d is a %s lease", lease.ErrNoLease, id, map[bool]string{true: "write", false: "read"}[h.write()])
	}
	if err == nil {
		_, err = cn.owner.Take(id) // fails only if it ended meanwhile (expiry)
	}
	if err != nil {
		return localwire.AppendError(b, statusOf(err), err.Error())
	}
	var res localwire.Result
	switch op {
	case localwire.OpCommit:
		res.Created, err = st.Insert(h.key, h.ext, h.layout)
		st.ReleaseExtent(h.ext) // Insert took its own reference
		if err != nil {
			return localwire.AppendError(b, statusOf(err), err.Error())
		}
	case localwire.OpAbort:
		st.ReleaseExtent(h.ext)
	case localwire.OpRelease:
		st.Unpin([]*store.Block{h.block})
	}
	return localwire.AppendResult(b, op, &res)
}
