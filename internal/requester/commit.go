package requester

import (
	"errors"
	"fmt"
)

// The commit and release phase of a window (fetch.go has the map): the
// lock is released, and the blocks it kept live are indexed.

// index inserts a block read under a live lock and records its outcome.
func (e *Engine) index(st *fetchState, b *planBlock, out *fetchOut) {
	created, ierr := e.store.Insert(b.key, b.ext, b.layout)
	switch {
	case ierr != nil:
		out.status[b.idx] = StatusFailed
		out.errs[b.idx] = &FetchError{Peer: st.peer, Phase: PhaseIndex, Class: ErrLocalResource, Err: ierr}
	case created:
		out.status[b.idx] = StatusFetched
		out.bytes += b.bytes
	default:
		out.status[b.idx] = StatusAlreadyLocal // indexed meanwhile (local put)
	}
}

// keepConfirmed indexes, of a fetch cut short or whose lock lapsed, the
// blocks read entirely before the lock was last confirmed live (a renewal
// sent after them succeeded, or the release answered live): docs/lessons.md L10, per
// block. A block read but not confirmed is marked discarded when drop is
// ErrDiscarded; the others are left to the fetch's error, which runFetch
// gives them. Called after Read returned, before
// the staging extents are released: an indexed block holds its own
// reference on its extent, so the memory of the dropped blocks goes back
// to the pool only with the extent, never while a READ can land in it.
func (e *Engine) keepConfirmed(st *fetchState, plan []*planBlock, tr *readTracker, live bool, out *fetchOut, drop error) {
	var kept, dropped, unread int
	var keptBytes uint64
	for i, b := range plan {
		switch {
		case tr.keep(i, live):
			e.index(st, b, out)
			kept++
			keptBytes += b.bytes
		case tr.landed(i):
			dropped++
			if errors.Is(drop, ErrDiscarded) {
				out.status[b.idx], out.errs[b.idx] = StatusDiscarded, drop
			}
		default:
			unread++
		}
	}
	if kept == 0 && dropped == 0 {
		return
	}
	e.log.Warn().Str("req_id", st.reqID).Str("remote", st.peer).Str("session", out.session).
		Int("kept", kept).Uint64("kept_bytes", keptBytes).Int("discarded", dropped).Int("unread", unread).
		Bool("released_live", live).AnErr("reason", drop).
		Msg("fetch cut short or its lock lapsed: blocks read before the lock was last confirmed live kept, later ones discarded")
}

// release ends a window that was read in full, and indexes its blocks
// only when the release says the lock was live to the end (docs/lessons.md L10).
func (p *pipeline) release(g *lockGuard, plan []*planBlock, tr *readTracker) error {
	e, st := p.e, p.st
	e.hook(p.ctx, st, PhaseRelease)
	rresp, err := g.Complete()
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
