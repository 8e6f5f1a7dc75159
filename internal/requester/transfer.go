package requester

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pegaflow/pegad/internal/conn"
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

// release ends a window that was read in full, and indexes its blocks
// only when the release says the lock was live to the end (docs/lessons.md L10).
func (p *pipeline) release(g *lockGuard, plan []*planBlock, tr *readTracker) error {
	e, st := p.e, p.st
	e.hook(p.ctx, st, PhaseRelease)
	rresp, err := g.Release()
	if err != nil {
		// Only the blocks a renewal confirmed are known to be read under
		// the live lock; the rest are dropped.
		if reclaimedRelease(err) {
			// A newer incarnation of this node reached the holder, which
			// reclaimed our session at once: the read ran under a lock that
			// may have ended (issue 5, fast reclaim).
			ferr := &FetchError{Peer: st.peer, Phase: PhaseRelease,
				Err: fmt.Errorf("%w (session %s reclaimed: holder saw a newer incarnation than %q: %w)",
					ErrDiscarded, g.sid, e.opts.Incarnation, err)}
			e.keepConfirmed(st, plan, tr, false, p.out, ferr)
			return ferr
		}
		// Whether the lock held until the end of the read is unknown.
		ferr := p.fail(PhaseRelease, err, ErrRemote)
		e.keepConfirmed(st, plan, tr, false, p.out, ferr)
		return ferr
	}
	if !g.releasedLive(rresp) {
		ferr := &FetchError{Peer: st.peer, Phase: PhaseRelease,
			Err: fmt.Errorf("%w (session %s ended %s)", ErrDiscarded, g.sid, rresp.GetEnd())}
		e.keepConfirmed(st, plan, tr, false, p.out, ferr)
		return ferr
	}
	e.hook(p.ctx, st, PhaseIndex)
	for _, b := range plan {
		e.index(st, b, p.out)
	}
	return nil
}
