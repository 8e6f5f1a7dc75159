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
	// dead (worker-owned): execute destroyed the QP because it could not
	// be drained; the worker must exit and touch it no more.
	dead bool
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

// run is the session worker: it executes batches one at a time until
// done closes. Owned by the connection (started in startWorkers, counted
// in Manager.workers).
func (s *session) run(done <-chan struct{}, m *Manager, log zerolog.Logger) {
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
	for {
		select {
		case <-done:
			return
		case <-s.kick:
		}
		for {
			b := s.pop()
			if b == nil {
				break
			}
			select {
			case <-done:
				s.answerInvalidated(b)
				return
			default:
			}
			if !b.state.CompareAndSwap(batchQueued, batchRunning) {
				continue // its Read canceled it and replied for it
			}
			r := s.execute(b, m, log)
			b.state.Store(batchFinished)
			b.res <- r
			if s.dead {
				return
			}
		}
	}
}

// execute posts b's WRs as signaled chains, at most SQDepth outstanding,
// and polls the QP's CQ until every posted WR has completed. On ctx expiry
// or a failure it moves the QP to ERROR and keeps polling until the posted
// WRs have flushed: when execute returns, none of them can touch memory.
func (s *session) execute(b *batch, m *Manager, log zerolog.Logger) batchResult {
	if err := b.ctx.Err(); err != nil {
		return batchResult{err: err}
	}
	s.seq++
	seq := s.seq & 0xffffffff
	wrs := b.wrs
	for i := range wrs {
		wrs[i].ID = seq<<32 | uint64(i)
	}
	depth := m.opts.SQDepth
	var (
		posted, completed int
		stop              bool // post nothing more
		res               batchResult
		firstIsFlush      bool
		successes         int
		drainBy           time.Time // deadline for flushing after ERROR
	)
	// fail records the first failure (a flush after our own abort is a
	// consequence, not a cause) and stops posting. The QP goes to ERROR
	// when it is broken or WRs are outstanding (they must flush before
	// execute returns); a ctx that expires with nothing outstanding leaves
	// the QP healthy.
	fail := func(err error, flush, qpBroken bool) {
		if res.err == nil || (firstIsFlush && !flush) {
			res.err = err
			firstIsFlush = flush
		}
		stop = true
		if !res.qpErrored && (qpBroken || posted > completed) {
			s.p.toError()
			res.qpErrored = true
			drainBy = time.Now().Add(m.drainTimeout)
		}
	}
	defer func() {
		if successes > 0 {
			m.met.WorkCompletions.WithLabelValues(wcLabel(ibv.WCSuccess)).Add(float64(successes))
		}
	}()

	for (!stop && posted < len(wrs)) || completed < posted {
		if !stop {
			if err := b.ctx.Err(); err != nil {
				fail(err, false, false)
				continue
			}
		}
		if !stop && posted < len(wrs) && posted-completed < depth {
			end := min(len(wrs), posted+depth-(posted-completed))
			bad, err := s.p.qp.PostSend(wrs[posted:end])
			switch {
			case err == nil:
				posted = end
			case errors.Is(err, ibv.ErrQueueFull) && posted+max(bad, 0) > completed:
				posted += max(bad, 0) // the rest goes after some completions
			default:
				posted += max(bad, 0)
				fail(fmt.Errorf("%w: post on qp %d: %w", ErrConnectionBroken, s.p.qpn, err), false, true)
				continue
			}
		}
		if completed == posted {
			continue
		}
		n, err := s.p.cq.Poll(s.wcs)
		if err != nil {
			// Cannot drain through a broken CQ: destroying the QP is the
			// only other guarantee that no WR touches memory afterwards.
			fail(fmt.Errorf("%w: poll cq of qp %d: %w", ErrConnectionBroken, s.p.qpn, err), false, true)
			log.Error().Err(err).Msg("poll failed; destroying qp to stop outstanding reads")
			s.destroyUndrained(m)
			return res
		}
		for _, wc := range s.wcs[:n] {
			if wc.ID>>32 != seq {
				log.Warn().Uint64("wr_id", wc.ID).Msg("stray work completion ignored")
				continue
			}
			completed++
			if wc.Status == ibv.WCSuccess {
				successes++
				if b.progress != nil {
					if i := wc.ID & 0xffffffff; i < uint64(len(wrs)) && i < uint64(len(b.ops)) {
						b.progress(b.ops[i], uint64(wrs[i].Length))
					}
				}
				continue
			}
			m.met.WorkCompletions.WithLabelValues(wcLabel(wc.Status)).Inc()
			se := &ibv.StatusError{Status: wc.Status, QPN: s.p.qpn, WRID: wc.ID, Cause: wc.Cause}
			fail(fmt.Errorf("%w: %w", ErrConnectionBroken, se), wc.Status == ibv.WCWRFlushErr, true)
		}
		if n > 0 {
			continue
		}
		var err2 error
		if !stop {
			err2 = s.p.cq.Wait(b.ctx)
		} else {
			if drainBy.IsZero() { // unreachable: outstanding WRs after stop imply ERROR
				drainBy = time.Now().Add(m.drainTimeout)
			}
			wctx, cancel := context.WithDeadline(context.Background(), drainBy)
			err2 = s.p.cq.Wait(wctx)
			cancel()
		}
		if err2 != nil {
			switch {
			case !stop && b.ctx.Err() != nil:
				fail(b.ctx.Err(), false, false)
			case stop && !time.Now().Before(drainBy):
				log.Error().Int("outstanding", posted-completed).Dur("waited", m.drainTimeout).
					Msg("qp did not drain after ERROR; destroying it to stop outstanding reads")
				s.destroyUndrained(m)
				return res
			default:
				fail(fmt.Errorf("%w: wait cq of qp %d: %w", ErrConnectionBroken, s.p.qpn, err2), false, true)
				log.Error().Err(err2).Int("outstanding", posted-completed).Msg("wait failed; destroying qp to stop outstanding reads")
				s.destroyUndrained(m)
				return res
			}
		}
	}
	return res
}

// destroyUndrained destroys the QP while WRs are still outstanding (it
// would not drain after ERROR, or its CQ broke): destroying is the other
// guarantee that none of them touches memory afterwards. The worker must
// exit and touch the QP no more.
func (s *session) destroyUndrained(m *Manager) {
	s.p.destroy(m)
	s.dead = true
	m.met.QPDrainFailures.Inc()
}
