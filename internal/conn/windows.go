package conn

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
)

// Memory windows (NICOptions.MemoryWindows): a peer may READ only what it
// locked. The holder registers its pool without remote read; each transfer
// lock gets, on every NIC of the requester's connection, one type-2 window
// (ibv_alloc_mw(3)) per extent of its blocks, bound (IBV_WR_BIND_MW) on one
// of that NIC's QPs of the connection, since a type-2 window's rkey works
// only on the QP it was bound on. The lock's answer carries the keys
// (pegadv1.MemoryWindows); the requester posts READs with them on that
// QP (plan, Grant). The lock's end deallocates the windows before its
// blocks are unpinned: from then on a READ with those keys, or with the
// pool's rkey, or of a byte outside the lock, completes with a remote
// access error on the requester and never reaches the memory.

const (
	// holdCQDepthWindows is the holder CQ's depth when windows are bound:
	// bind completions land there. windowSlots keeps the binds in flight
	// per NIC within it.
	holdCQDepthWindows = 1024
	// bindBatch binds (at most NICOptions.SQDepth) are posted before their
	// completions are awaited; qpPair.binds keeps the binds of concurrent
	// locks on one QP within its send queue.
	bindBatch = 32
)

// bindTimeout bounds waiting for a lock's bind completions (a completion
// takes microseconds; a QP in ERROR flushes them at once), and
// bindFlushTimeout the wait for those still owed once their QP was moved
// to ERROR (flushBinds). Variables so that tests can shorten them.
var (
	bindTimeout      = 5 * time.Second
	bindFlushTimeout = 5 * time.Second
)

// ErrNoWindows: the holder cannot bind windows for this requester: it has
// no accepted connection of that incarnation (the requester handshakes
// before it locks), or the binds failed on every NIC.
var ErrNoWindows = errors.New("conn: no memory windows")

// Extent is a range of pool memory a transfer lock covers.
type Extent struct{ Addr, Len uint64 }

// MergeExtents sorts ranges and merges those that overlap or touch.
func MergeExtents(ext []Extent) []Extent {
	slices.SortFunc(ext, func(a, b Extent) int { return cmp.Compare(a.Addr, b.Addr) })
	out := ext[:0]
	for _, e := range ext {
		if e.Len == 0 {
			continue
		}
		if k := len(out) - 1; k >= 0 && e.Addr <= out[k].Addr+out[k].Len {
			out[k].Len = max(out[k].Len, e.Addr+e.Len-out[k].Addr)
			continue
		}
		out = append(out, e)
	}
	return out
}

// windowWaiters routes the completions of one NIC's holder CQ (binds are
// all that complete there) to the binds that await them.
type windowWaiters struct {
	// slots bounds the binds in flight on the NIC to the CQ's depth.
	slots *semaphore.Weighted
	// mu guards waiting and next, and serializes polling the CQ.
	mu      sync.Mutex
	waiting map[uint64]chan ibv.WorkCompletion
	next    uint64

	// stuckMu guards stuck: windows whose dealloc failed (quarantine.go),
	// kept allocated and retried when the NIC is released.
	stuckMu sync.Mutex
	stuck   []ibv.MW
}

func newWindowWaiters() windowWaiters {
	return windowWaiters{slots: semaphore.NewWeighted(holdCQDepthWindows), waiting: make(map[uint64]chan ibv.WorkCompletion)}
}

// memoryWindows says whether locks will be served through windows:
// asked for, and every device binds type-2 windows (else a warning).
func (s *NICs) memoryWindows(opts NICOptions) bool {
	if !opts.MemoryWindows {
		return false
	}
	for _, d := range opts.Devices {
		if info := d.Info(); !info.MemWindows {
			s.log.Warn().Str("nic", info.Name).Msg("NIC binds no type-2 memory windows: --memory-windows is off, " +
				"every peer that handshakes can READ the whole pool with its rkey")
			return false
		}
	}
	s.log.Info().Int("nics", len(opts.Devices)).Msg("memory windows on: a peer READs only the blocks it locked")
	return true
}

// Windows are one transfer lock's memory windows. Close invalidates them.
type Windows struct {
	acc  *Acceptor
	hsID string
	nics []*winNIC
	once sync.Once
	err  error // Close's, set once under once
}

// winNIC is a lock's windows on one of the requester's NICs.
type winNIC struct {
	a          *acceptedConn // the connection whose QP p is
	reqNIC, qp int
	p          *qpPair
	mws        []ibv.MW
	keys       []*pegadv1.WindowKey
}

// BindWindows binds windows over ext (merged, MergeExtents) on the
// accepted connection of requester node of incarnation inc, one QP per NIC
// (rotating over the connection's QPs from lock to lock), and returns them
// once every bind completed. A NIC whose binds fail is left out; none
// left is an error wrapping ErrNoWindows, with nothing left bound. Binds
// that did not complete in time, or windows that could not be
// deallocated after a failure, fail the whole lock closed (failClosed):
// the error is then also an *InvalidationError (ErrWindowsLive) when a
// window may still be valid over ext, whose memory the caller must then
// never reuse.
func (acc *Acceptor) BindWindows(ctx context.Context, node, inc string, ext []Extent) (*Windows, error) {
	if !acc.nics.windows {
		return nil, fmt.Errorf("%w: memory windows are off", ErrNoWindows)
	}
	// Close waits for binds in flight before the QPs and PDs go.
	if err := acc.begin(); err != nil {
		return nil, err
	}
	defer acc.accepts.Done()
	acc.mu.Lock()
	a := acc.accepted[node]
	acc.mu.Unlock()
	if a == nil || a.incarnation != inc {
		acc.met.WindowBinds.WithLabelValues(resultError).Inc()
		return nil, fmt.Errorf("%w: no connection of requester %s (incarnation %s) to bind them on", ErrNoWindows, node, inc)
	}
	// Not the caller's cancel: a bind given up on early would leave its
	// completion owed to a CQ slot already handed to another bind.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bindTimeout)
	defer cancel()
	w := &Windows{acc: acc, hsID: a.handshakeID}
	turn := acc.windowTurn.Add(1)
	var errs []error
	broken := false // a NIC's QP failed closed: the connection is gone
	for i, qs := range a.nics {
		if len(qs) == 0 || qs[0].nic.down.Load() {
			continue
		}
		q := int(turn % uint64(len(qs)))
		wn := &winNIC{a: a, reqNIC: i, qp: q, p: qs[q]}
		err := acc.bindOn(ctx, wn, ext)
		if err == nil {
			w.nics = append(w.nics, wn)
			continue
		}
		errs = append(errs, err)
		broken = broken || errors.Is(err, errBindsOwed)
		if derr := acc.invalidate(wn); derr != nil { // what it bound before the failure
			errs = append(errs, derr)
			broken = true
		}
	}
	if broken {
		return nil, acc.bindFailedClosed(w, node, errs)
	}
	if len(w.nics) == 0 {
		acc.met.WindowBinds.WithLabelValues(resultError).Inc()
		return nil, fmt.Errorf("%w: requester %s: %w", ErrNoWindows, node, errors.Join(errs...))
	}
	acc.met.WindowBinds.WithLabelValues(resultOK).Inc()
	if len(errs) > 0 {
		acc.log.Warn().Err(errors.Join(errs...)).Str("remote_node", node).Int("nics", len(w.nics)).
			Msg("memory windows bound on some NICs only")
	}
	return w, nil
}

// bindOn allocates and binds one window per extent on wn's QP, bindBatch
// at a time, each batch awaited before the next is posted.
func (acc *Acceptor) bindOn(ctx context.Context, wn *winNIC, ext []Extent) error {
	n := wn.p.nic
	pd, ok1 := n.pd.(ibv.MWPD)
	qp, ok2 := wn.p.qp.(ibv.MWQP)
	if !ok1 || !ok2 {
		return fmt.Errorf("%w: %s binds no windows", ErrNoWindows, n.info.Name)
	}
	for len(ext) > 0 {
		batch := ext[:min(len(ext), bindBatch, acc.nics.opts.SQDepth)]
		ext = ext[len(batch):]
		k := int64(len(batch))
		if err := n.win.slots.Acquire(ctx, k); err != nil {
			return fmt.Errorf("bind windows on %s: %w", n.info.Name, err)
		}
		if err := wn.p.binds.Acquire(ctx, k); err != nil {
			n.win.slots.Release(k)
			return fmt.Errorf("bind windows on %s qp %d: %w", n.info.Name, wn.p.qpn, err)
		}
		err := acc.bindBatch(ctx, wn, pd, qp, batch)
		wn.p.binds.Release(k)
		n.win.slots.Release(k) // bindBatch returns with no completion owed
		if err != nil {
			return err
		}
	}
	return nil
}

// bindBatch allocates and binds a window per extent of batch, then awaits
// every bind it posted, also when one failed to be made or posted (their
// completions are owed to the CQ slots the caller holds). Completions
// still owed when ctx ends are flushed (flushBinds): it never returns
// with one owed, so the caller's slots can be handed on.
func (acc *Acceptor) bindBatch(ctx context.Context, wn *winNIC, pd ibv.MWPD, qp ibv.MWQP, batch []Extent) error {
	n := wn.p.nic
	ch := make(chan ibv.WorkCompletion, len(batch))
	var ids []uint64 // of the binds posted
	defer func() { n.win.forget(ids) }()
	var failed error
	for _, e := range batch {
		if !n.acquireUse() {
			failed = fmt.Errorf("bind windows on %s: %w", n.info.Name, ErrNICReleased)
			break
		}
		mw, err := pd.AllocMW()
		if err != nil {
			n.releaseUse()
			failed = fmt.Errorf("bind windows on %s: %w", n.info.Name, err)
			break
		}
		n.endUse() // counted in users until dealloc
		wn.mws = append(wn.mws, mw)
		n.windows.Inc()
		id := n.win.expect(ch)
		rkey, err := qp.PostBindMW(mw, n.mr, e.Addr, e.Len, ibv.AccessRemoteRead, id, true)
		if err != nil {
			n.win.forget([]uint64{id})
			failed = fmt.Errorf("bind windows on %s qp %d: %w", n.info.Name, wn.p.qpn, err)
			break
		}
		ids = append(ids, id)
		wn.keys = append(wn.keys, &pegadv1.WindowKey{Base: e.Addr, Length: e.Len, Rkey: rkey})
	}
	got, err := acc.awaitBinds(ctx, n, ch, len(ids), failed)
	if got < len(ids) {
		err = acc.flushBinds(wn, ch, len(ids)-got, err)
	}
	return err
}

// awaitBinds collects count completions from ch, polling n's holder CQ,
// and returns how many it got and failed (if not nil), else the first
// failed completion's error, else ctx's error if it ends first.
func (acc *Acceptor) awaitBinds(ctx context.Context, n *localNIC, ch chan ibv.WorkCompletion, count int, failed error) (int, error) {
	first := failed
	pause := time.Microsecond
	got := 0
	for got < count {
		select {
		case wc := <-ch:
			got++
			if wc.Status != ibv.WCSuccess && first == nil {
				first = fmt.Errorf("bind window on %s: %w", n.info.Name, &ibv.StatusError{Status: wc.Status, QPN: wc.QPN,
					WRID: wc.ID, VendorErr: wc.VendorErr, Cause: wc.Cause})
			}
			continue
		default:
		}
		if err := n.win.poll(n.holderCQNow()); err != nil && first == nil {
			first = fmt.Errorf("poll holder cq on %s: %w", n.info.Name, err)
		}
		if len(ch) > 0 {
			continue
		}
		if err := ctx.Err(); err != nil {
			if first == nil {
				first = fmt.Errorf("bind windows on %s: %d of %d completions: %w", n.info.Name, got, count, err)
			}
			return got, first
		}
		time.Sleep(pause)
		pause = min(2*pause, time.Millisecond)
	}
	return got, first
}

// expect registers a completion to route to ch and returns its wr_id.
func (ww *windowWaiters) expect(ch chan ibv.WorkCompletion) uint64 {
	ww.mu.Lock()
	defer ww.mu.Unlock()
	ww.next++
	ww.waiting[ww.next] = ch
	return ww.next
}

// forget stops routing ids (awaited, or given up on: a late completion is
// dropped).
func (ww *windowWaiters) forget(ids []uint64) {
	ww.mu.Lock()
	defer ww.mu.Unlock()
	for _, id := range ids {
		delete(ww.waiting, id)
	}
}

// poll drains cq and routes what it finds.
func (ww *windowWaiters) poll(cq ibv.CQ) error {
	if cq == nil {
		return nil
	}
	var wcs [16]ibv.WorkCompletion
	ww.mu.Lock()
	defer ww.mu.Unlock()
	for {
		k, err := cq.Poll(wcs[:])
		for _, wc := range wcs[:k] {
			if ch, ok := ww.waiting[wc.ID]; ok {
				delete(ww.waiting, wc.ID)
				ch <- wc // buffered for every id of its batch
			}
		}
		if err != nil || k < len(wcs) {
			return err
		}
	}
}

// Proto is what the lock's answer carries: the keys per requester NIC,
// and the handshake whose QPs they were bound on.
func (w *Windows) Proto() ([]*pegadv1.MemoryWindows, string) {
	out := make([]*pegadv1.MemoryWindows, 0, len(w.nics))
	for _, wn := range w.nics {
		out = append(out, &pegadv1.MemoryWindows{Nic: uint32(wn.reqNIC), Qp: uint32(wn.qp), Keys: wn.keys})
	}
	return out, w.hsID
}

// Close deallocates every window, which invalidates it: when Close
// returns nil, no READ through them touches memory. A window that could
// not be deallocated fails closed (failClosed: its QP is moved to ERROR,
// its connection invalidated) and Close returns an *InvalidationError
// (ErrWindowsLive): the memory under the lock must then never be reused.
// Idempotent: a second call returns the first's result.
func (w *Windows) Close() error {
	w.once.Do(func() {
		var errs []error
		for _, wn := range w.nics {
			if err := w.acc.invalidate(wn); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) > 0 {
			w.acc.met.WindowBinds.WithLabelValues(resultQuarantined).Inc()
			w.err = errors.Join(errs...)
		}
	})
	return w.err
}

// BindLock is BindWindows over the segments of a lock's blocks, for the
// holder (holder.Windows): the answer's windows, the handshake they are
// bound on, and the release that invalidates them (Windows.Close).
func (acc *Acceptor) BindLock(ctx context.Context, node, inc string, blocks []*pegadv1.BlockLocation) (
	[]*pegadv1.MemoryWindows, string, func() error, error) {
	var ext []Extent
	for _, b := range blocks {
		for _, s := range b.GetSlots() {
			for _, g := range []*pegadv1.Segment{s.GetK(), s.GetV()} {
				if g != nil {
					ext = append(ext, Extent{Addr: g.GetAddr(), Len: g.GetSize()})
				}
			}
		}
	}
	w, err := acc.BindWindows(ctx, node, inc, MergeExtents(ext))
	if err != nil {
		return nil, "", nil, err
	}
	keys, hs := w.Proto()
	return keys, hs, w.Close, nil
}
