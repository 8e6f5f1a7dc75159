package conn

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/metrics"
)

// Batch states. Whoever moves a batch out of batchQueued owns its reply:
// the worker (queued→running→finished, or queued→finished when it exits)
// or the Read that canceled it (queued→finished).
const (
	batchQueued int32 = iota
	batchRunning
	batchFinished
)

// batch is one Read's work on one QP.
type batch struct {
	ctx   context.Context
	s     *session
	wrs   []ibv.SendWR
	state atomic.Int32
	res   chan<- batchResult // buffered for every batch of its Read
	// ops[i] is the index in Read's ops of the op wrs[i] belongs to.
	ops []int
	// progress, when set, gets each successful READ's op index and length
	// (WithOpProgress, WithProgress).
	progress func(op int, bytes uint64)
}

type batchResult struct {
	err error
	// qpErrored: the QP is in ERROR now (completion error, abort): the
	// connection must be invalidated.
	qpErrored bool
}

// finishUnrun replies for a batch that never ran, if nobody else owns it,
// and reports whether it did.
func (b *batch) finishUnrun(err error) bool {
	if b.state.CompareAndSwap(batchQueued, batchFinished) {
		b.res <- batchResult{err: err}
		return true
	}
	return false
}

// session is one QP with its worker's command queue. The worker holds
// nothing that keeps the connection alive: it exits when the
// connection's done channel closes, replying ErrSessionInvalidated to
// every batch it accepted but did not run.
type session struct {
	p   *qpPair
	met *metrics.Metrics

	// mu guards queue and closed.
	mu     sync.Mutex
	queue  []*batch
	closed bool

	kick   chan struct{} // cap 1: "queue may be non-empty"
	exited chan struct{} // closed when the worker has returned
	wcs    []ibv.WorkCompletion
	seq    uint64 // worker-owned batch sequence, tags WR ids
}

func newSession(p *qpPair, met *metrics.Metrics) *session {
	return &session{p: p, met: met, kick: make(chan struct{}, 1), exited: make(chan struct{}), wcs: make([]ibv.WorkCompletion, 64)}
}

// submit queues b; once the worker is gone, b gets ErrSessionInvalidated
// at once (never a block, never a generic closed-channel error).
func (s *session) submit(b *batch) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.answerInvalidated(b)
		return
	}
	s.queue = append(s.queue, b)
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

func (s *session) pop() *batch {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) == 0 {
		return nil
	}
	b := s.queue[0]
	s.queue[0] = nil
	s.queue = s.queue[1:]
	return b
}

// answerInvalidated replies ErrSessionInvalidated to a batch that will
// never run (unless its Read canceled it first) and counts it.
func (s *session) answerInvalidated(b *batch) {
	if b.finishUnrun(fmt.Errorf("%w (qpn %d)", ErrSessionInvalidated, s.p.qpn)) {
		s.met.BatchesInvalidated.Inc()
	}
}

// run is the session worker: it runs batches through its pipeline until
// done closes. Owned by the connection (started in startWorkers, counted
// in Dialer.workers).
func (s *session) run(done <-chan struct{}, ns *NICs, log zerolog.Logger) {
	log = log.With().Uint32("qpn", s.p.qpn).Logger()
	log.Debug().Msg("session worker started")
	defer func() {
		s.mu.Lock()
		s.closed = true
		q := s.queue
		s.queue = nil
		s.mu.Unlock()
		for _, b := range q {
			s.answerInvalidated(b)
		}
		close(s.exited)
		log.Debug().Int("dropped_batches", len(q)).Msg("session worker exited")
	}()
	pl := &pipeline{s: s, ns: ns, log: log}
	for {
		select {
		case <-done:
			return
		case <-s.kick:
		}
		if pl.pump(done) {
			return
		}
	}
}

// running is one admitted batch in the worker's pipeline.
type running struct {
	b   *batch
	seq uint64 // the batch's tag in its WR ids (upper 32 bits)
	// posted and completed count b.wrs; stop: post nothing more.
	posted, completed int
	stop              bool
	res               batchResult
	firstIsFlush      bool // res.err is a flush (a consequence, not a cause)
	successes         int
}

// done reports whether r has nothing more to post and nothing outstanding.
func (r *running) done() bool {
	return (r.stop || r.posted == len(r.b.wrs)) && r.completed == r.posted
}

// pipeline is a session worker's in-flight state: the batches it has
// admitted, in order, sharing the QP's send queue. A batch is admitted as
// soon as the one before it is fully posted and the queue has room, so the
// queue stays full across batches instead of draining between them.
// Worker-owned: only the session's goroutine touches it.
type pipeline struct {
	s           *session
	ns          *NICs
	log         zerolog.Logger
	runs        []*running
	outstanding int // WRs posted and not yet completed, over all runs
	// errored: the QP was moved to ERROR; every outstanding WR must flush
	// (by drainBy) before its batch replies, and nothing more is posted.
	errored bool
	drainBy time.Time
}

// pump admits, posts and completes batches until none is queued or in
// flight. Once done has closed it admits no more, but still finishes the
// batches in flight. It reports whether the worker must exit: done has
// closed, or the QP was destroyed undrained.
func (pl *pipeline) pump(done <-chan struct{}) (exit bool) {
	for {
		closing := false
		select {
		case <-done:
			closing = true
		default:
			pl.admit()
		}
		if len(pl.runs) == 0 {
			return closing
		}
		pl.checkContexts()
		pl.post()
		if !pl.complete() {
			return true // destroyed: every run replied
		}
		pl.finish()
	}
}

// admit takes queued batches while the last admitted one is fully posted
// and the send queue has room. A batch whose context already expired, or
// that arrives on a QP in ERROR, is answered at once.
func (pl *pipeline) admit() {
	s := pl.s
	for pl.outstanding < pl.ns.opts.SQDepth {
		if n := len(pl.runs); n > 0 {
			if last := pl.runs[n-1]; !last.stop && last.posted < len(last.b.wrs) {
				return
			}
		}
		b := s.pop()
		if b == nil {
			return
		}
		if !b.state.CompareAndSwap(batchQueued, batchRunning) {
			continue // its Read canceled it and replied for it
		}
		var res batchResult
		switch {
		case b.ctx.Err() != nil:
			res.err = b.ctx.Err()
		case pl.errored:
			res = batchResult{err: fmt.Errorf("%w: qp %d is in ERROR", ErrConnectionBroken, s.p.qpn), qpErrored: true}
		default:
			s.seq++
			r := &running{b: b, seq: s.seq & 0xffffffff}
			for i := range b.wrs {
				b.wrs[i].ID = r.seq<<32 | uint64(i)
			}
			pl.runs = append(pl.runs, r)
			continue
		}
		b.state.Store(batchFinished)
		b.res <- res
	}
}

// checkContexts stops every run whose Read gave up (its context expired
// or was canceled by abort): with WRs outstanding that moves the QP to
// ERROR, without it leaves the QP healthy.
func (pl *pipeline) checkContexts() {
	for _, r := range pl.runs {
		if !r.stop && !r.done() {
			if err := r.b.ctx.Err(); err != nil {
				pl.fail(r, err, false, false)
			}
		}
	}
}

// post fills the send queue from the runs in admission order, at most
// SQDepth WRs outstanding over all of them, as signaled chains.
func (pl *pipeline) post() {
	s, depth := pl.s, pl.ns.opts.SQDepth
	for _, r := range pl.runs {
		wrs := r.b.wrs
		if r.stop || r.posted == len(wrs) {
			continue
		}
		if pl.outstanding >= depth {
			return
		}
		end := min(len(wrs), r.posted+depth-pl.outstanding)
		bad, err := s.p.qp.PostSend(wrs[r.posted:end])
		switch {
		case err == nil:
			pl.outstanding += end - r.posted
			r.posted = end
		case errors.Is(err, ibv.ErrQueueFull) && pl.outstanding+max(bad, 0) > 0:
			pl.outstanding += max(bad, 0)
			r.posted += max(bad, 0) // the rest goes after some completions
			return
		default:
			pl.outstanding += max(bad, 0)
			r.posted += max(bad, 0)
			pl.fail(r, fmt.Errorf("%w: post on qp %d: %w", ErrConnectionBroken, s.p.qpn, err), false, true)
			return
		}
		if r.posted < len(wrs) {
			return // later runs wait for this one's WRs to be posted
		}
	}
}

// complete polls the CQ once, and waits for it when it was empty, unless
// nothing is outstanding. It reports false when it destroyed the QP (a
// broken CQ, or a QP that did not drain after ERROR): every run has
// replied then and the worker must exit.
func (pl *pipeline) complete() bool {
	if pl.outstanding == 0 {
		return true
	}
	s := pl.s
	n, err := s.p.cq.Poll(s.wcs)
	if err != nil {
		// Cannot drain through a broken CQ: destroying the QP is the
		// only other guarantee that no WR touches memory afterwards.
		pl.log.Error().Err(err).Msg("poll failed; destroying qp to stop outstanding reads")
		pl.destroy(fmt.Errorf("%w: poll cq of qp %d: %w", ErrConnectionBroken, s.p.qpn, err))
		return false
	}
	for _, wc := range s.wcs[:n] {
		pl.completion(wc)
	}
	if n > 0 {
		return true
	}
	return pl.wait()
}

// completion accounts one work completion to the run its WR id names.
func (pl *pipeline) completion(wc ibv.WorkCompletion) {
	var r *running
	for _, c := range pl.runs {
		if c.seq == wc.ID>>32 {
			r = c
			break
		}
	}
	if r == nil {
		pl.log.Warn().Uint64("wr_id", wc.ID).Msg("stray work completion ignored")
		return
	}
	r.completed++
	pl.outstanding--
	if wc.Status == ibv.WCSuccess {
		r.successes++
		if b := r.b; b.progress != nil {
			if i := wc.ID & 0xffffffff; i < uint64(len(b.wrs)) && i < uint64(len(b.ops)) {
				b.progress(b.ops[i], uint64(b.wrs[i].Length))
			}
		}
		return
	}
	pl.ns.met.WorkCompletions.WithLabelValues(wcLabel(wc.Status)).Inc()
	se := &ibv.StatusError{Status: wc.Status, QPN: pl.s.p.qpn, WRID: wc.ID, VendorErr: wc.VendorErr, Cause: wc.Cause}
	if wc.Status != ibv.WCWRFlushErr {
		pl.log.Warn().Str("status", wc.Status.String()).Uint32("vendor_err", wc.VendorErr).Uint64("wr_id", wc.ID).
			Msg("work completion failed")
	}
	pl.fail(r, fmt.Errorf("%w: %w", ErrConnectionBroken, se), wc.Status == ibv.WCWRFlushErr, true)
}

// wait blocks until the CQ may hold completions: while the QP is healthy,
// or until a run's Read gives up; after ERROR, until the drain deadline,
// past which the QP is destroyed. It reports false when it destroyed it.
func (pl *pipeline) wait() bool {
	s := pl.s
	if !pl.errored {
		ctx, cancel := pl.waitContext()
		err := s.p.cq.Wait(ctx)
		cancel()
		if err == nil || pl.anyExpired() {
			return true // checkContexts stops the runs that gave up
		}
		pl.log.Error().Err(err).Int("outstanding", pl.outstanding).Msg("wait failed; destroying qp to stop outstanding reads")
		pl.destroy(fmt.Errorf("%w: wait cq of qp %d: %w", ErrConnectionBroken, s.p.qpn, err))
		return false
	}
	wctx, cancel := context.WithDeadline(context.Background(), pl.drainBy)
	err := s.p.cq.Wait(wctx)
	cancel()
	switch {
	case err == nil:
		return true
	case !time.Now().Before(pl.drainBy):
		pl.log.Error().Int("outstanding", pl.outstanding).Dur("waited", pl.ns.drainTimeout).
			Msg("qp did not drain after ERROR; destroying it to stop outstanding reads")
		pl.destroy(nil)
	default:
		pl.log.Error().Err(err).Int("outstanding", pl.outstanding).Msg("wait failed; destroying qp to stop outstanding reads")
		pl.destroy(fmt.Errorf("%w: wait cq of qp %d: %w", ErrConnectionBroken, s.p.qpn, err))
	}
	return false
}

// waitContext is done when the context of any run still in flight is:
// the run's own one when there is a single context (one Read at a time,
// the common case), else one merged from all of them.
func (pl *pipeline) waitContext() (context.Context, context.CancelFunc) {
	first := pl.runs[0].b.ctx
	same := true
	for _, r := range pl.runs[1:] {
		same = same && r.b.ctx == first
	}
	if same {
		return first, func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	stops := make([]func() bool, 0, len(pl.runs))
	for _, r := range pl.runs {
		stops = append(stops, context.AfterFunc(r.b.ctx, cancel))
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel()
	}
}

func (pl *pipeline) anyExpired() bool {
	for _, r := range pl.runs {
		if !r.stop && r.b.ctx.Err() != nil {
			return true
		}
	}
	return false
}

// fail records r's first failure (a flush after an abort is a
// consequence, not a cause) and stops it posting. The QP goes to ERROR
// when it is broken or r has WRs outstanding (they must flush before r
// replies); a Read that gives up with nothing outstanding leaves it
// healthy. Once the QP is in ERROR every run in flight fails with it.
func (pl *pipeline) fail(r *running, err error, flush, qpBroken bool) {
	if r.res.err == nil || (r.firstIsFlush && !flush) {
		r.res.err = err
		r.firstIsFlush = flush
	}
	r.stop = true
	if pl.errored {
		r.res.qpErrored = true
		return
	}
	if !qpBroken && r.posted == r.completed {
		return
	}
	pl.s.p.toError()
	pl.errored = true
	pl.drainBy = time.Now().Add(pl.ns.drainTimeout)
	r.res.qpErrored = true
	for _, o := range pl.runs {
		if o != r && !o.done() {
			pl.fail(o, fmt.Errorf("%w: qp %d moved to ERROR by another batch", ErrConnectionBroken, pl.s.p.qpn), true, true)
		}
	}
}

// finish replies for every run that has nothing more to post and nothing
// outstanding, and drops it from the pipeline.
func (pl *pipeline) finish() {
	keep := pl.runs[:0]
	for _, r := range pl.runs {
		if r.done() {
			pl.reply(r)
		} else {
			keep = append(keep, r)
		}
	}
	clear(pl.runs[len(keep):])
	pl.runs = keep
}

func (pl *pipeline) reply(r *running) {
	if r.successes > 0 {
		pl.ns.met.WorkCompletions.WithLabelValues(wcLabel(ibv.WCSuccess)).Add(float64(r.successes))
	}
	r.b.state.Store(batchFinished)
	r.b.res <- r.res
}

// destroy destroys the QP with WRs outstanding (see destroyUndrained) and
// replies for every run in flight: with err where a run has no failure
// of its own yet, and as having errored the QP.
func (pl *pipeline) destroy(err error) {
	pl.s.destroyUndrained(pl.ns)
	for _, r := range pl.runs {
		if r.res.err == nil || (r.firstIsFlush && err != nil) {
			r.res.err = err
		}
		if r.res.err == nil {
			r.res.err = fmt.Errorf("%w: qp %d destroyed undrained", ErrConnectionBroken, pl.s.p.qpn)
		}
		r.res.qpErrored = true
		pl.reply(r)
	}
	clear(pl.runs)
	pl.runs = pl.runs[:0]
	pl.outstanding = 0
}

// destroyUndrained destroys the QP while WRs are still outstanding (it
// would not drain after ERROR, or its CQ broke): destroying is the other
// guarantee that none of them touches memory afterwards. The worker must
// exit and touch the QP no more.
func (s *session) destroyUndrained(ns *NICs) {
	s.p.destroy(ns)
	ns.met.QPDrainFailures.Inc()
}
