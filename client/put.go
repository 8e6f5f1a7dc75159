package client

import (
	"context"
	"fmt"
	"time"

	"github.com/pegaflow/pegad/api/localwire"
)

// spare is room the daemon reserved for this connection's next Put
// (RESERVE, or the next reservation of a PUT): Put copies into it and
// commits it with one PUT, which reserves the next spare in the same round
// trip. It is a lease like any other: the daemon gives it back when the
// connection closes, or when it is left unused for the lease timeout.
type spare struct {
	id  uint64
	mem []byte
	at  time.Time // when the request that made it was sent: its lease started later
}

// spareMaxAge is how old a spare may be and still be written: half the
// lease timeout, so a spare is never written after the daemon could have
// expired it and given its room to another block.
func (d *dataConn) spareMaxAge() time.Duration { return d.leaseTimeout / 2 }

// takeSpare hands the spare to the caller: as sp when it fits size bytes
// and is young enough; as other when it is young but of another size (the
// caller keeps it if it cannot reserve, aborts it otherwise); as stale when
// too old to write (the caller aborts it).
func (d *dataConn) takeSpare(size int) (sp, other, stale *spare) {
	d.mu.Lock()
	defer d.mu.Unlock()
	sp, d.spare = d.spare, nil
	switch {
	case sp == nil:
		return nil, nil, nil
	case time.Since(sp.at) >= d.spareMaxAge():
		return nil, nil, sp
	case len(sp.mem) != size:
		return nil, sp, nil
	}
	return sp, nil, nil
}

// keepSpare makes sp the connection's spare; one already there (another
// Put's) wins and sp is aborted.
func (d *dataConn) keepSpare(sp *spare) {
	d.mu.Lock()
	keep := d.spare == nil && !d.closed && d.broken == nil
	if keep {
		d.spare = sp
	}
	d.mu.Unlock()
	if !keep {
		_ = cleanupFinish(d, localwire.OpAbort, []uint64{sp.id})
	}
}

// reserve asks for a spare of size bytes.
func (d *dataConn) reserve(ctx context.Context, size int) (*spare, error) {
	sent := time.Now()
	res, err := d.call(ctx, localwire.OpReserve, 1, func(b []byte) []byte { return localwire.AppendID(b, uint64(size)) })
	if err != nil {
		return nil, err
	}
	r := res[0]
	if r.Status != localwire.StatusOK {
		return nil, fromWire(localwire.OpReserve, r.Status, r.Msg)
	}
	return d.spareAt(r, size, sent)
}

// spareAt is the spare of a RESERVE or PUT result, checked to lie in the
// pool with the size asked for (aborted otherwise).
func (d *dataConn) spareAt(r localwire.Result, size int, sent time.Time) (*spare, error) {
	mem, ok := d.slice(r.Seg.Off, r.Seg.Len)
	if !ok || len(mem) != size {
		_ = cleanupFinish(d, localwire.OpAbort, []uint64{r.Lease})
		return nil, fmt.Errorf("%w: reservation of %d bytes at [%d,+%d) (pool of %d)", ErrProtocol, size, r.Seg.Off, r.Seg.Len, len(d.mem))
	}
	return &spare{id: r.Lease, mem: mem, at: sent}, nil
}

// put stores data as one block in one round trip when the connection has
// a spare of its size (two for the first Put, or after a Put of another
// size): copy into the spare, then PUT commits it and reserves the next.
// It returns whether the block was created (false: the key was stored
// already and this copy was dropped).
func (d *dataConn) put(ctx context.Context, k localwire.Key, slots []SlotSize, data []byte) (bool, error) {
	sp, other, stale := d.takeSpare(len(data))
	if stale != nil {
		_ = cleanupFinish(d, localwire.OpAbort, []uint64{stale.id}) // NO_LEASE when it expired: nothing to do
	}
	if sp == nil {
		var err error
		if sp, err = d.reserve(ctx, len(data)); err != nil {
			if other != nil {
				d.keepSpare(other) // a refused Put changes nothing
			}
			return false, err
		}
		if other != nil {
			_ = cleanupFinish(d, localwire.OpAbort, []uint64{other.id})
		}
	}
	copy(sp.mem, data)
	item := localwire.PutItem{ID: sp.id, Key: k, Slots: make([]localwire.SlotSize, len(slots))}
	for i, s := range slots {
		item.Slots[i] = localwire.SlotSize{K: s.K, V: s.V}
	}
	if d.spareMaxAge() > 0 {
		item.Next = uint64(len(data))
	}
	sent := time.Now()
	res, err := d.call(ctx, localwire.OpPut, 1, func(b []byte) []byte { return localwire.AppendPutItem(b, item) })
	if err != nil {
		// Either nothing was sent (a context already done) and the spare
		// is still ours, or the connection broke and the daemon ended it
		// (keepSpare then drops it).
		d.keepSpare(sp)
		return false, err
	}
	r := res[0]
	switch {
	case r.Status == localwire.StatusInvalid:
		d.keepSpare(sp) // refused before it was touched: still ours
		return false, fromWire(localwire.OpPut, r.Status, r.Msg)
	case r.Status != localwire.StatusOK:
		return false, fromWire(localwire.OpPut, r.Status, r.Msg)
	case r.Next == localwire.StatusOK && r.Lease != 0:
		next, err := d.spareAt(r, len(data), sent)
		if err != nil {
			return r.Created, err
		}
		d.keepSpare(next)
	}
	// A next reservation the daemon could not make (pool full of pinned
	// blocks) only means the next Put reserves first.
	return r.Created, nil
}
