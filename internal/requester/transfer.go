package requester

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/store"
)

// lease is one window's lock while it is read: its guard, and the renewer
// that keeps it alive from the lock on.
type lease struct {
	g *lockGuard
	// ctx ends at the lock's deadline (errTransferDeadline) when no
	// renewal extends it, or when the fetch's ctx ends.
	ctx  context.Context
	stop func() // stops the renewer; returns once it has
}

// pastDeadline marks err as caused by the lock's deadline when it was.
func (l *lease) pastDeadline(p *pipeline, err error) error {
	if c := context.Cause(l.ctx); errors.Is(c, errTransferDeadline) && p.ctx.Err() == nil {
		return fmt.Errorf("%w: %w", errTransferDeadline, err)
	}
	return err
}

// transfer reads one lock window: plan → renew → stage → read → release →
// index. Its session is released on every exit: here on the normal and
// handled paths, by the guard's abort on a cancel or a panic.
func (p *pipeline) transfer(w window) error {
	e, st, resp := p.e, p.st, w.resp
	var g *lockGuard
	l := w.lease // started when the lock was granted (query)
	if l != nil {
		g = l.g
		// Runs on every exit; a no-op when the normal path released.
		defer func() { g.Abort(abortReason(p.ctx)) }()
		defer l.stop() // before the abort: the renewer stops first
	}
	// handled releases the lock on a handled error. A cancelled fetch
	// leaves that to the guard's abort path.
	handled := func(phase string, cause, fallback error) error {
		ferr := p.fail(phase, cause, fallback)
		if l != nil {
			l.stop() // no renewal races the release
		}
		if g != nil && p.ctx.Err() == nil {
			_, _ = g.Release()
		}
		return ferr
	}
	plan, err := e.plan(p.keys, w.asked, resp, p.out)
	if err != nil {
		return handled(PhaseLock, err, ErrRemote)
	}
	if len(plan) == 0 {
		if g != nil {
			l.stop()
			_, _ = g.Release()
		}
		return nil // every block of this window missing on the peer
	}
	if g == nil {
		return handled(PhaseLock, errNoSession, ErrRemote)
	}
	if p.ctx.Err() != nil {
		return p.fail(PhaseLock, ctxErr(p.ctx), ErrDeadline)
	}
	tr := newReadTracker(plan)
	l.tracker.Store(tr)
	// A holder that restarted since our handshake answers with another
	// incarnation: our QPs and its memory snapshot are stale. Reconnect now
	// instead of learning it from a failed READ or a retry budget of silence.
	if p.rd, err = e.ensureCurrent(l.ctx, st, p.rd, resp.GetHolderIncarnation()); err != nil {
		l.stop()
		return handled(PhaseConnect, l.pastDeadline(p, err), ErrConnection)
	}
	// A holder with memory windows serves this lock only through them.
	grant, err := conn.NewGrant(resp.GetWindows(), resp.GetWindowsHandshakeId())
	if err != nil {
		l.stop()
		return handled(PhaseLock, err, ErrRemote)
	}
	var total uint64
	for _, b := range plan {
		total += b.bytes
	}
	st.addWindow(g.sid, len(plan), total)
	stg := &staging{e: e, st: st, sid: g.sid}
	defer stg.free() // after index: an indexed block holds its own reference
	// read may keep only a prefix of plan: the blocks the pool has room for.
	plan, rerr := p.read(&l.lease, stg, plan, tr, resp.GetHolderIncarnation(), grant)
	if rerr != nil {
		return p.readFailed(&l.lease, plan, tr, rerr)
	}
	return p.release(g, plan, tr)
}

// trackedLease is a lease and the tracker its renewals confirm, set once
// the window's plan is made.
type trackedLease struct {
	lease
	tracker *atomic.Pointer[readTracker]
}

// startLease starts the renewer of w's lock as soon as it is granted: the
// lease counts from the lock, so renewals do too, while the window before
// it is still read, and through the reconnect and the staging as well as
// the read. Without it a next window locked behind a slow read lapses
// before its own read starts (a review finding: docs/lessons.md, "Issue 23
// defect 2").
func (p *pipeline) startLease(g *lockGuard, w window) *trackedLease {
	lockTimeout := w.resp.GetLockTimeout().AsDuration()
	if lockTimeout <= 0 {
		lockTimeout = defaultLockTimeout
	}
	ctx, cancel := context.WithCancelCause(p.ctx)
	tr := new(atomic.Pointer[readTracker])
	done := p.e.startRenewer(ctx, cancel, g, tr, w.lockedAt, lockTimeout)
	var once sync.Once
	return &trackedLease{tracker: tr, lease: lease{g: g, ctx: ctx, stop: func() {
		once.Do(func() {
			cancel(nil)
			<-done
		})
	}}}
}

// startRenewer starts the goroutine that keeps the lock alive from the lock
// on (reconnect, staging, read). It belongs to the fetch and exits when ctx
// is done; the returned channel closes when it has. It renews every
// lock_timeout/3 counted from lockedAt (the lease's own clock, not when the
// read began) and cancels ctx (errTransferDeadline) when the lock's
// deadline minus a safety margin passes without a renewal. A failed
// renewal is counted (pegaflow_transfer_lock_renew_failures_total), logged
// and retried at the next tick; the fetch goes on. A renewal that succeeds
// confirms the blocks that landed before it was sent (the tracker in tr,
// set once the window's plan is made: until then no block has landed); the
// release's was_live confirms the rest.
func (e *Engine) startRenewer(ctx context.Context, cancelRead context.CancelCauseFunc, g *lockGuard,
	tr *atomic.Pointer[readTracker], lockedAt time.Time, lockTimeout time.Duration) <-chan struct{} {
	done := make(chan struct{})
	margin := min(5*time.Second, lockTimeout/10)
	deadline := lockedAt.Add(lockTimeout - margin)
	interval := max(lockTimeout/3, time.Millisecond)
	go func() {
		defer close(done)
		dl := time.NewTimer(time.Until(deadline))
		defer dl.Stop()
		next := lockedAt.Add(interval)
		tick := time.NewTimer(time.Until(next))
		defer tick.Stop()
		req := &pegadv1.RenewTransferLockRequest{SessionId: g.sid, Requester: e.requester()}
		for {
			select {
			case <-ctx.Done():
				return
			case <-dl.C:
				cancelRead(errTransferDeadline)
				return
			case <-tick.C:
				// Behind schedule (slow renewals) it renews back to back;
				// each RPC is bounded by interval.
				next = next.Add(interval)
				tick.Reset(time.Until(next))
				sent := time.Now()
				t := tr.Load()
				var stamp uint64
				if t != nil {
					stamp = t.renewalSent()
				}
				rctx, cancel := context.WithTimeout(ctx, interval)
				resp, err := g.client.RenewTransferLock(rctx, req)
				cancel()
				if err != nil {
					if ctx.Err() != nil {
						return
					}
					e.m.RenewFailures.Inc()
					e.log.Warn().Err(err).Str("session", g.sid).Str("remote", g.st.peer).Str("req_id", g.st.reqID).
						Msg("transfer lock renewal failed; the read goes on until the lock's deadline")
					continue
				}
				// The lock was live when this renewal was sent: the blocks
				// that landed before it are confirmed.
				if t != nil {
					t.confirm(stamp)
				}
				// Durations only: the holder's clock is not ours.
				ext := lockTimeout
				if ll := resp.GetLifetimeLeft(); ll != nil && ll.AsDuration() < ext {
					ext = ll.AsDuration()
				}
				if nd := sent.Add(ext - margin); nd.After(deadline) {
					deadline = nd
					dl.Reset(time.Until(deadline))
				}
			}
		}
	}()
	return done
}

// staging is the staging memory of one window, freed after its blocks are
// indexed, or quarantined when a Read may still write into it.
type staging struct {
	e    *Engine
	st   *fetchState
	sid  string
	exts []extent
	// readPending is true while a Read may still write into exts: set
	// before Read, cleared once it returned.
	readPending bool
}

// free hands the staging to the prefetch's keep set, which releases it
// when the prefetch returns: the blocks indexed in it stay unevictable
// until then (keepSet). Quarantined instead while a READ may land in it.
func (s *staging) free() {
	if s.readPending {
		// Read never returned (it panicked): a QP may still write into
		// this memory, so it is leaked rather than handed out again
		// (docs/lessons.md L9).
		var n uint64
		for _, x := range s.exts {
			n += x.Len()
		}
		s.e.m.StagingQuarantine.Add(float64(n))
		s.e.log.Error().Str("req_id", s.st.reqID).Str("remote", s.st.peer).Str("session", s.sid).
			Uint64("bytes", n).Msg("staging memory quarantined: read did not return")
		return
	}
	s.st.keep.extents(s.exts)
}

// stagingAlign aligns every segment placed in a staging extent.
const stagingAlign = 64

func alignUp(n uint64) uint64 { return (n + stagingAlign - 1) &^ (stagingAlign - 1) }

// stage places the planned blocks, in plan order, in staging extents.
// Blocks are grouped by the local NUMA node sp places them on (without sp:
// by their remote NUMA node, staged anywhere); each extent is sized
// min(bytes of that group still to place, maxChunk, the largest allocation
// the pool can hold: one NUMA part) and never less than the block being
// placed (docs/lessons.md L5): large fetches bound eviction amplification, small
// fetches work on small pools. A chunk the pool has no room for is asked
// again the size of its first block, so a pool nearly full still takes
// the blocks that fit. It stops at the first block it cannot place:
// plan[:placed] are placed, and it returns every extent it allocated, also
// on error.
func (e *Engine) stage(plan []*planBlock, sp *conn.StagingPlan) (exts []extent, placed int, err error) {
	ns, onNode := e.store.(nodeStore)
	onNode = onNode && sp != nil
	type group struct {
		remaining, used uint64
		cur             extent
	}
	groups := make(map[int]*group)
	keyOf := make([]int, len(plan))
	for i, b := range plan {
		k := b.numa
		if onNode {
			k = sp.Place(b.numa, b.size)
		}
		keyOf[i] = k
		if groups[k] == nil {
			groups[k] = &group{}
		}
		groups[k].remaining += b.size
	}
	alloc := func(key int, n uint64) (extent, error) {
		if onNode {
			return ns.AllocStagingOn(key, n)
		}
		return e.store.AllocStaging(n)
	}
	// No allocation can exceed one part of a NUMA-split pool: a chunk
	// larger than that fails although its blocks fit in smaller ones.
	chunk := min(e.maxChunk, e.store.MaxStaging())
	for i, b := range plan {
		key, g := keyOf[i], groups[keyOf[i]]
		if g.cur == nil || g.cur.Len()-g.used < b.size {
			n := max(b.size, min(g.remaining, chunk))
			x, aerr := alloc(key, n)
			if aerr != nil && n > b.size && errors.Is(aerr, store.ErrNoSpace) {
				x, aerr = alloc(key, b.size)
			}
			if aerr != nil {
				return exts, i, fmt.Errorf("staging %d bytes (NUMA group %d): %w", n, key, aerr)
			}
			exts = append(exts, x)
			g.cur, g.used = x, 0
		}
		b.ext = g.cur
		for j := range b.layout {
			b.layout[j].KOff += g.used
			if b.layout[j].VLen > 0 {
				b.layout[j].VOff += g.used
			}
		}
		g.used += b.size
		g.remaining -= b.size
	}
	return exts, len(plan), nil
}

// buildOps makes one READ per segment (K and V) of every planned block;
// opBlock[i] is the plan index of the block op i reads. grant: the lock's
// memory windows (nil: none).
func buildOps(plan []*planBlock, grant *conn.Grant) (ops []conn.ReadOp, opBlock []int) {
	for pi, b := range plan {
		base := b.ext.Addr()
		for j, s := range b.loc.GetSlots() {
			l := b.layout[j]
			k := s.GetK()
			ops = append(ops, conn.ReadOp{LocalAddr: base + l.KOff, RemoteAddr: k.GetAddr(), Len: l.KLen, NUMA: int(k.GetNumaNode()), Grant: grant})
			if v := s.GetV(); v != nil {
				ops = append(ops, conn.ReadOp{LocalAddr: base + l.VOff, RemoteAddr: v.GetAddr(), Len: l.VLen, NUMA: int(v.GetNumaNode()), Grant: grant})
			}
		}
		for len(opBlock) < len(ops) {
			opBlock = append(opBlock, pi)
		}
	}
	return ops, opBlock
}

// read stages plan and reads it, bounded by the lease; once it returns,
// the renewer is stopped and no READ can land in the staging memory. It
// returns the blocks it read: plan, or the prefix of it the pool had room
// for beside what the prefetch keeps (fitting).
func (p *pipeline) read(l *lease, stg *staging, plan []*planBlock, tr *readTracker, holderInc string, grant *conn.Grant) ([]*planBlock, error) {
	e, st := p.e, p.st
	e.hook(p.ctx, st, PhaseStage)
	var sp *conn.StagingPlan
	if sp2, ok := p.rd.(stagingPlanner); ok {
		sp = sp2.StagingPlan()
	}
	var (
		serr   error
		placed int
	)
	stg.exts, placed, serr = e.stage(plan, sp)
	if serr != nil {
		if plan = p.fitting(plan, placed, serr); plan == nil {
			l.stop()
			return plan, &stageError{serr}
		}
		if len(plan) == 0 {
			l.stop()
			return plan, nil // nothing of this window fits: release it unread
		}
	}
	ops, opBlock := buildOps(plan, grant)
	tr.opBlock = opBlock

	e.hook(p.ctx, st, PhaseRead)
	// A fetch cancelled by now (shutdown, the caller) posts no READ. The
	// fetch's own ctx is asked, not the lease's: a child context is
	// cancelled only after its parent's Done has closed, so a goroutine
	// woken by the parent could find the lease still live, post, and
	// report as read a fetch that was aborted (TestDrainTimeoutAbortsFetch
	// failed that way on CI).
	if err := p.ctx.Err(); err != nil {
		l.stop()
		return plan, ctxErr(p.ctx)
	}
	// Bytes count as their completions arrive (sessions list, the
	// fetch-bytes counter); each block's completion is tracked, so a fetch
	// cut short keeps the blocks read before the lock was last confirmed.
	readCtx := conn.WithOpProgress(conn.WithReqID(l.ctx, st.reqID), func(op int, n uint64) {
		tr.completed(op, n)
		st.done.Add(n)
		e.m.FetchBytes.Add(float64(n))
	})
	stg.readPending = true
	before := st.done.Load() // bytes the windows before this one read
	rerr := p.rd.Read(readCtx, ops)
	// Not with memory windows: they are bound on this connection's QPs
	// only, so a fresh one cannot use them (the window fails, loudly).
	if rerr != nil && grant == nil && innocent(rerr) && l.ctx.Err() == nil {
		// The connection broke under us while our own context is fine:
		// most often another fetch's cancel moved shared QPs to ERROR.
		// Read returned, so nothing can land in the staging memory any
		// more: read it all again, once, on a fresh connection.
		e.log.Info().Err(rerr).Str("req_id", st.reqID).Str("remote", st.peer).Str("session", l.g.sid).
			Msg("read failed on a broken connection; retrying once on a fresh one")
		e.conns.Invalidate(p.rd, rerr)
		nrd, gerr := e.conns.Get(l.ctx, st.peer)
		if gerr == nil {
			nrd, gerr = e.ensureCurrent(l.ctx, st, nrd, holderInc)
		}
		if gerr != nil {
			rerr = fmt.Errorf("reconnect after %w: %w", rerr, gerr)
		} else {
			p.rd = nrd
			st.done.Store(before) // read this window again
			tr.reset()
			rerr = p.rd.Read(readCtx, ops)
		}
	}
	// Read returned: the connection has flushed every QP that could write
	// into the staging memory, so it may go back to the pool (docs/lessons.md L9).
	stg.readPending = false
	l.stop()
	if rerr != nil {
		rerr = l.pastDeadline(p, rerr)
		if invalidates(rerr) {
			e.conns.Invalidate(p.rd, rerr)
		}
	}
	return plan, rerr
}

// fitting decides what a window whose staging stopped at plan[placed]
// (serr) reads. When the pool is full and this prefetch keeps blocks of
// its own (earlier windows, blocks found local, or this window's placed
// prefix), those are what is in the way, and they are not to be evicted
// for later ones (issue 33, item 7): the blocks placed are read, the rest
// of the window and of the fetch are StatusNotFetched, and the pipeline
// stops after this window. Otherwise (a pool full of others' pins, a
// failure that is not a full pool) it returns nil: the fetch fails as
// before.
func (p *pipeline) fitting(plan []*planBlock, placed int, serr error) []*planBlock {
	var staged uint64
	for _, b := range plan[:placed] {
		staged += b.size
	}
	held := p.st.keep.held() + staged
	if held == 0 || !errors.Is(serr, store.ErrNoSpace) {
		return nil
	}
	p.full = tooSmall(plan[placed].size, held, serr)
	for _, b := range plan[placed:] {
		p.out.status[b.idx], p.out.errs[b.idx] = StatusNotFetched, p.full
	}
	p.e.log.Warn().Str("req_id", p.st.reqID).Str("remote", p.st.peer).Int("placed", placed).
		Int("not_fetched", len(plan)-placed).Uint64("held_bytes", held).Err(serr).
		Msg("pool too small for the whole prefetch: fetching what fits, in order; the rest is not fetched")
	return plan[:placed]
}

// stageError is a staging failure, as read returns it.
type stageError struct{ err error }

func (s *stageError) Error() string { return s.err.Error() }
func (s *stageError) Unwrap() error { return s.err }

// readFailed handles a read (or staging) that failed: a cancel or a
// shutdown leaves the release to the guard and keeps nothing; any other
// cut (the lock's or the caller's deadline, a broken link) releases here
// and keeps what was read under a lock confirmed live.
func (p *pipeline) readFailed(l *lease, plan []*planBlock, tr *readTracker, rerr error) error {
	var se *stageError
	if errors.As(rerr, &se) {
		ferr := p.fail(PhaseStage, se.err, ErrLocalResource)
		if p.ctx.Err() == nil {
			_, _ = l.g.Release()
		}
		return ferr
	}
	ferr := p.fail(PhaseRead, rerr, ErrConnection)
	if p.ctx.Err() != nil && !errors.Is(p.ctx.Err(), context.DeadlineExceeded) {
		return ferr
	}
	rresp, relErr := l.g.Release()
	live := relErr == nil && l.g.releasedLive(rresp)
	p.e.keepConfirmed(p.st, plan, tr, live, p.out, &FetchError{Peer: p.st.peer, Phase: PhaseRead,
		Err: fmt.Errorf("%w (read, but not confirmed under a live lock before the fetch failed: %w)", ErrDiscarded, rerr)})
	return ferr
}

// innocent reports whether a read failed because its connection broke
// under it (a batch flushed or never run), which a fresh connection need
// not repeat: another fetch's cancel breaks the QPs it shares with us.
func innocent(err error) bool {
	if errors.Is(err, conn.ErrRailDown) {
		return true // the NIC is out of placement now: a fresh connection avoids it
	}
	if !errors.Is(err, conn.ErrSessionInvalidated) && !errors.Is(err, conn.ErrConnectionBroken) {
		return false
	}
	// A WR of this read completed in error by itself (retry exceeded,
	// remote access): the link or the peer failed, not a bystander's
	// cancel. Retrying would only wait out the deadline on a dead path and
	// turn a connection error into a deadline one. Flushed WRs are
	// collateral and do qualify.
	var se *ibv.StatusError
	if errors.As(err, &se) && se.Status != ibv.WCWRFlushErr {
		return false
	}
	return true
}
