package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pegaflow/pegad/api/localwire"
)

// Writer is room in the pool for one block, under a write lease: write the
// block's bytes into Bytes, then Commit to store it or Abort to give the
// room back. Until then nobody else can read or index it; if the client
// dies, the daemon gives the room back.
type Writer struct {
	d       *dataConn
	id      uint64
	mem     []byte
	mu      sync.Mutex // guards done, created
	done    bool
	created bool
}

// Bytes is the block's memory (slot order: slot 0 K, slot 0 V, ...), valid
// until Commit, Abort or Client.Close. Writing to it after that writes into
// memory that may belong to another block.
func (w *Writer) Bytes() []byte { return w.mem }

// Commit indexes the block; after it the block is immutable and Bytes must
// not be written. A block someone else committed under the same key first
// wins: Commit returns nil and Created reports false.
func (w *Writer) Commit(ctx context.Context) error {
	return commitBatch(ctx, []*Writer{w})
}

// Created reports whether Commit stored this block (false: the key was
// stored by someone else first and this copy was dropped).
func (w *Writer) Created() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.created
}

// Abort gives the room back. After Commit or Abort it does nothing.
func (w *Writer) Abort() error {
	ctx, cancel := cleanupContext()
	defer cancel()
	return finishBatch(ctx, w.d, localwire.OpAbort, writersIDs([]*Writer{w}))
}

// cleanupTimeout bounds the calls that take no context (Abort, Release):
// a daemon that does not answer within it has the connection closed,
// which ends the lease anyway.
const cleanupTimeout = 10 * time.Second

func cleanupContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), cleanupTimeout)
}

// cleanupFinish ends leases on a path that has no caller context left (a
// batch that failed half-way), bounded by cleanupTimeout so that a daemon
// that stops answering cannot block the connection's mutex forever.
func cleanupFinish(d *dataConn, op localwire.Op, ids []uint64) error {
	ctx, cancel := cleanupContext()
	defer cancel()
	return finishBatch(ctx, d, op, ids)
}

// Renew pushes the lease's deadline back by the lease timeout.
func (w *Writer) Renew(ctx context.Context) error {
	return renew(ctx, w.d, w.id)
}

// take marks w finished; false when it already was.
func (w *Writer) take() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return false
	}
	w.done = true
	return true
}

// Slot is one slot of a leased block: its K and V segments in the mapped
// pool (V nil when the slot has none).
type Slot struct{ K, V []byte }

// Reader is a stored block pinned under a read lease: read it in place
// through Bytes or Slots, then Release. The daemon keeps its memory until
// Release (or the client's exit), even if the block is deleted or evicted
// meanwhile.
type Reader struct {
	d     *dataConn
	id    uint64
	slots []Slot
	whole []byte // the whole block when its segments are contiguous
	size  int
	mu    sync.Mutex // guards done
	done  bool
}

// Bytes is the whole block (slot order) when its segments lie back to back
// in the pool, as a Put's do; nil otherwise (a block fetched from a peer
// may be scattered): then use Slots. Valid until Release or Client.Close;
// never write to it.
func (r *Reader) Bytes() []byte { return r.whole }

// Slots is where each slot's segments are; valid until Release.
func (r *Reader) Slots() []Slot { return r.slots }

// Size is the block's length in bytes.
func (r *Reader) Size() int { return r.size }

// Release unpins the block. After the first call it does nothing.
func (r *Reader) Release() error {
	ctx, cancel := cleanupContext()
	defer cancel()
	return r.release(ctx)
}

func (r *Reader) release(ctx context.Context) error {
	return finishBatch(ctx, r.d, localwire.OpRelease, readersIDs([]*Reader{r}))
}

// Renew pushes the lease's deadline back by the lease timeout.
func (r *Reader) Renew(ctx context.Context) error { return renew(ctx, r.d, r.id) }

func (r *Reader) take() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.done {
		return false
	}
	r.done = true
	return true
}

// Alloc takes room in the pool for a block of size bytes and a write lease
// on it. ErrExists when the key is already stored (nothing to write),
// ErrPoolFull when it does not fit even after evicting every unpinned block.
func (c *Client) Alloc(ctx context.Context, namespace string, hash []byte, size int, opts ...PutOption) (*Writer, error) {
	slots, err := slotsFor(size, opts)
	if err != nil {
		return nil, err
	}
	res, err := c.AllocBatch(ctx, []AllocRequest{{Namespace: namespace, Hash: hash, Slots: slots}})
	if err != nil {
		return nil, err
	}
	return res[0].Writer, res[0].Err
}

// AllocRequest is one block of AllocBatch; Slots (one slot of Size bytes
// when nil) gives its shape.
type AllocRequest struct {
	Namespace string
	Hash      []byte
	Size      int
	Slots     []SlotSize
}

// AllocResult is one block's outcome: a Writer, or why not.
type AllocResult struct {
	Writer *Writer
	Err    error
}

// AllocBatch is Alloc of many blocks in as few round trips as the frame
// limits allow. The error is for the call as a whole; each block's own
// outcome is in its result.
func (c *Client) AllocBatch(ctx context.Context, reqs []AllocRequest) ([]AllocResult, error) {
	if c.data == nil {
		return nil, ErrNoZeroCopy
	}
	out := make([]AllocResult, len(reqs))
	items := make([]localwire.AllocItem, len(reqs))
	for i, r := range reqs {
		slots := r.Slots
		if slots == nil {
			var err error
			if slots, err = slotsFor(r.Size, nil); err != nil {
				out[i].Err = err
			}
		}
		if len(slots) > localwire.MaxSlots {
			out[i].Err = fmt.Errorf("%w: %d slots (max %d)", ErrInvalid, len(slots), localwire.MaxSlots)
		}
		k, err := keyItem(r.Namespace, r.Hash)
		if err != nil {
			out[i].Err = err
		}
		items[i].Key = k
		for _, s := range slots {
			items[i].Slots = append(items[i].Slots, localwire.SlotSize{K: s.K, V: s.V})
		}
	}
	todo := make([]int, 0, len(reqs))
	for i := range reqs {
		if out[i].Err == nil {
			todo = append(todo, i)
		}
	}
	if len(todo) == 0 {
		return out, nil
	}
	d, err := c.data.get(ctx)
	if err != nil {
		return nil, err
	}
	for len(todo) > 0 {
		n, size := 0, 0
		for n < len(todo) && n < localwire.MaxBatch {
			it := items[todo[n]]
			sz := 4 + 3 + len(it.Namespace) + len(it.Hash) + 2 + 16*len(it.Slots) // 4: ALLOC_ON's node
			if n > 0 && size+sz > localwire.MaxFrame/2 {
				break
			}
			size += sz
			n++
		}
		batch := todo[:n]
		todo = todo[n:]
		op := localwire.OpAlloc
		if c.node != NoNUMANode && d.version >= localwire.MinVersionOf(localwire.OpAllocOn) {
			op = localwire.OpAllocOn
		}
		res, err := d.call(ctx, op, n, func(b []byte) []byte {
			for _, i := range batch {
				if op == localwire.OpAllocOn {
					b = localwire.AppendAllocOnItem(b, localwire.AllocOnItem{Node: int32(c.node), AllocItem: items[i]})
				} else {
					b = localwire.AppendAllocItem(b, items[i])
				}
			}
			return b
		})
		if err != nil {
			abortAll(d, out)
			return nil, err
		}
		for j, i := range batch {
			r := res[j]
			if r.Status != localwire.StatusOK {
				out[i].Err = fromWire(localwire.OpAlloc, r.Status, r.Msg)
				continue
			}
			mem, ok := d.slice(r.Seg.Off, r.Seg.Len)
			if !ok {
				out[i].Err = fmt.Errorf("%w: alloc at [%d,+%d) outside the pool", ErrProtocol, r.Seg.Off, r.Seg.Len)
				_ = cleanupFinish(d, localwire.OpAbort, []uint64{r.Lease})
				continue
			}
			out[i].Writer = &Writer{d: d, id: r.Lease, mem: mem}
		}
	}
	return out, nil
}

// abortAll gives back the writers already allocated when a batch fails.
func abortAll(d *dataConn, res []AllocResult) {
	var ws []*Writer
	for _, r := range res {
		if r.Writer != nil {
			ws = append(ws, r.Writer)
		}
	}
	_ = cleanupFinish(d, localwire.OpAbort, writersIDs(ws))
}

// CommitBatch commits many writers in one round trip per MaxBatch; the
// error joins the failures of single writers.
func (c *Client) CommitBatch(ctx context.Context, ws []*Writer) error {
	if c.data == nil {
		return ErrNoZeroCopy
	}
	return commitBatch(ctx, ws)
}

func writersIDs(ws []*Writer) []uint64 {
	ids := make([]uint64, 0, len(ws))
	for _, w := range ws {
		if w != nil && w.take() {
			ids = append(ids, w.id)
		}
	}
	return ids
}

func readersIDs(rs []*Reader) []uint64 {
	ids := make([]uint64, 0, len(rs))
	for _, r := range rs {
		if r != nil && r.take() {
			ids = append(ids, r.id)
		}
	}
	return ids
}

// commitBatch commits each writer on its own connection: a lease id is
// sent only on the connection that took it (after a reconnect an old id
// may name another lease on the new one).
func commitBatch(ctx context.Context, ws []*Writer) error {
	var order []*dataConn
	byConn := map[*dataConn][]*Writer{}
	for _, w := range ws {
		if w != nil && w.take() {
			if byConn[w.d] == nil {
				order = append(order, w.d)
			}
			byConn[w.d] = append(byConn[w.d], w)
		}
	}
	var errs []error
	for _, d := range order {
		if err := commitOn(ctx, d, byConn[d]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func commitOn(ctx context.Context, d *dataConn, live []*Writer) error {
	var errs []error
	for len(live) > 0 {
		batch := live[:min(len(live), localwire.MaxBatch)]
		live = live[len(batch):]
		res, err := d.call(ctx, localwire.OpCommit, len(batch), func(b []byte) []byte {
			for _, w := range batch {
				b = localwire.AppendID(b, w.id)
			}
			return b
		})
		if err != nil {
			return errors.Join(append(errs, err)...)
		}
		for j, w := range batch {
			if res[j].Status != localwire.StatusOK {
				errs = append(errs, fromWire(localwire.OpCommit, res[j].Status, res[j].Msg))
				continue
			}
			w.mu.Lock()
			w.created = res[j].Created
			w.mu.Unlock()
		}
	}
	return errors.Join(errs...)
}

// finishBatch sends ABORT or RELEASE for ids.
func finishBatch(ctx context.Context, d *dataConn, op localwire.Op, ids []uint64) error {
	var errs []error
	for len(ids) > 0 {
		batch := ids[:min(len(ids), localwire.MaxBatch)]
		ids = ids[len(batch):]
		res, err := d.call(ctx, op, len(batch), func(b []byte) []byte {
			for _, id := range batch {
				b = localwire.AppendID(b, id)
			}
			return b
		})
		if err != nil {
			if errors.Is(err, ErrClosed) {
				return nil // the daemon ended every lease when the client closed
			}
			return errors.Join(append(errs, err)...)
		}
		for _, r := range res {
			if r.Status != localwire.StatusOK {
				errs = append(errs, fromWire(op, r.Status, r.Msg))
			}
		}
	}
	return errors.Join(errs...)
}

func renew(ctx context.Context, d *dataConn, id uint64) error {
	res, err := d.call(ctx, localwire.OpRenew, 1, func(b []byte) []byte { return localwire.AppendID(b, id) })
	if err != nil {
		return err
	}
	if res[0].Status != localwire.StatusOK {
		return fromWire(localwire.OpRenew, res[0].Status, res[0].Msg)
	}
	return nil
}

// Lease pins a stored block for reading in place. ErrNotFound when it is
// not stored.
func (c *Client) Lease(ctx context.Context, namespace string, hash []byte) (*Reader, error) {
	res, err := c.LeaseBatch(ctx, namespace, [][]byte{hash})
	if err != nil {
		return nil, err
	}
	return res[0].Reader, res[0].Err
}

// LeaseResult is one block's outcome: a Reader, or why not.
type LeaseResult struct {
	Reader *Reader
	Err    error
}

// LeaseBatch is Lease of many blocks of one namespace in one round trip
// per MaxBatch.
func (c *Client) LeaseBatch(ctx context.Context, namespace string, hashes [][]byte) ([]LeaseResult, error) {
	if c.data == nil {
		return nil, ErrNoZeroCopy
	}
	out := make([]LeaseResult, len(hashes))
	keys := make([]localwire.Key, len(hashes))
	todo := make([]int, 0, len(hashes))
	for i, h := range hashes {
		k, err := keyItem(namespace, h)
		if err != nil {
			out[i].Err = err
			continue
		}
		keys[i] = k
		todo = append(todo, i)
	}
	if len(todo) == 0 {
		return out, nil
	}
	d, err := c.data.get(ctx)
	if err != nil {
		return nil, err
	}
	for len(todo) > 0 {
		batch := todo[:min(len(todo), localwire.MaxBatch)]
		todo = todo[len(batch):]
		res, err := d.call(ctx, localwire.OpLease, len(batch), func(b []byte) []byte {
			for _, i := range batch {
				b = localwire.AppendKeyItem(b, keys[i])
			}
			return b
		})
		if err != nil {
			var rs []*Reader
			for _, r := range out {
				rs = append(rs, r.Reader)
			}
			_ = cleanupFinish(d, localwire.OpRelease, readersIDs(rs))
			return nil, err
		}
		for j, i := range batch {
			r := res[j]
			if r.Status == localwire.StatusNotFound {
				out[i].Err = notFound(namespace, hashes[i])
				continue
			}
			if r.Status != localwire.StatusOK {
				out[i].Err = fromWire(localwire.OpLease, r.Status, r.Msg)
				continue
			}
			rd, err := d.reader(r)
			if err != nil {
				out[i].Err = err
				_ = cleanupFinish(d, localwire.OpRelease, []uint64{r.Lease})
				continue
			}
			out[i].Reader = rd
		}
	}
	return out, nil
}

// reader builds a Reader from a LEASE result, checking every segment lies
// inside the mapped pool.
func (d *dataConn) reader(r localwire.Result) (*Reader, error) {
	rd := &Reader{d: d, id: r.Lease, slots: make([]Slot, len(r.Slots))}
	contiguous := true
	var start, next uint64
	for i, s := range r.Slots {
		for j, seg := range []localwire.Segment{s.K, s.V} {
			if seg.Len == 0 {
				continue
			}
			mem, ok := d.slice(seg.Off, seg.Len)
			if !ok {
				return nil, fmt.Errorf("%w: lease segment [%d,+%d) outside the pool", ErrProtocol, seg.Off, seg.Len)
			}
			if j == 0 {
				rd.slots[i].K = mem
			} else {
				rd.slots[i].V = mem
			}
			if rd.size == 0 {
				start, next = seg.Off, seg.Off
			}
			if seg.Off != next {
				contiguous = false
			}
			next = seg.Off + seg.Len
			rd.size += int(seg.Len)
		}
	}
	if contiguous && rd.size > 0 {
		rd.whole, _ = d.slice(start, uint64(rd.size))
	}
	return rd, nil
}

// ReleaseBatch releases many readers in one round trip per MaxBatch.
func (c *Client) ReleaseBatch(rs []*Reader) error {
	if c.data == nil {
		return ErrNoZeroCopy
	}
	ctx, cancel := cleanupContext()
	defer cancel()
	var order []*dataConn
	byConn := map[*dataConn][]*Reader{}
	for _, r := range rs {
		if r != nil {
			if byConn[r.d] == nil {
				order = append(order, r.d)
			}
			byConn[r.d] = append(byConn[r.d], r)
		}
	}
	var errs []error
	for _, d := range order { // each lease on its own connection (see commitBatch)
		if err := finishBatch(ctx, d, localwire.OpRelease, readersIDs(byConn[d])); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
