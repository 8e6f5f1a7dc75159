package requester

import (
	"context"
)

// prefetchRun is one Prefetch call's progress over its rounds. It belongs
// to the calling goroutine (no lock).
type prefetchRun struct {
	e       *Engine
	st      *fetchState
	res     *Result
	outcome map[string]BlockResult // by hash
	ferr    error                  // first error of a fetch this call ran
	joinErr error                  // first error of a fetch it waited on
	fetched bool                   // this call ran a fetch of its own
}

// round sorts pending hashes into already local, owned (this call fetches
// them) and joined (another call is fetching them from the same peer),
// fetches the owned, waits for the joined, and returns the hashes to try
// again: joined blocks whose owner gave up (its own cancel or shorter
// deadline) while this call's ctx is still fine.
func (r *prefetchRun) round(ctx context.Context, pending [][]byte) (retry [][]byte) {
	e, st := r.e, r.st
	c := e.flights.claim(st.peer, st.ns, pending, e.store.Has)
	owned, ownedFlights, joined := c.owned, c.ownedFlights, c.joined
	for _, key := range c.local {
		// Pinned until the prefetch returns: "already_local" must still
		// be true when the engine reads it, whatever this prefetch stages
		// next. One evicted since it was found is fetched next round.
		if !st.keep.local(key) {
			retry = append(retry, []byte(key.Hash))
			continue
		}
		r.outcome[key.Hash] = BlockResult{Status: StatusAlreadyLocal}
	}

	if len(owned) > 0 {
		r.fetched = true
		var out fetchOut
		var ferr error
		func() {
			// Joiners must never wait forever: complete every owned flight
			// whatever happens in the fetch.
			defer func() { e.flights.complete(owned, ownedFlights, out, ctx.Err() != nil) }()
			out, ferr = e.runFetch(ctx, st, owned)
		}()
		r.res.Bytes += out.bytes
		if out.session != "" {
			r.res.SessionID = out.session
		}
		if r.ferr == nil {
			r.ferr = ferr
		}
		for i, key := range owned {
			r.outcome[key.Hash] = BlockResult{Status: out.status[i], Err: out.errs[i]}
		}
	}

	// Wait for the blocks other calls are fetching (after our own fetch, so
	// two calls that each join the other's blocks cannot deadlock).
	if len(joined) > 0 {
		st.setPhase(PhaseWait)
	}
	for _, j := range joined {
		select {
		case <-j.f.done:
			if j.f.status == StatusFailed && j.f.ownerGone && ctx.Err() == nil {
				retry = append(retry, []byte(j.key.Hash))
				continue
			}
			if ok := j.f.status == StatusFetched || j.f.status == StatusAlreadyLocal; ok && !st.keep.local(j.key) {
				// Its owner's prefetch returned and let it go, and it was
				// evicted since: fetch it again.
				retry = append(retry, []byte(j.key.Hash))
				continue
			}
			r.outcome[j.key.Hash] = BlockResult{Status: j.f.status, Err: j.f.err}
			if j.f.err != nil && r.joinErr == nil {
				r.joinErr = j.f.err
			}
		case <-ctx.Done():
			err := &FetchError{Peer: st.peer, Phase: "wait", Class: classify(ctxErr(ctx), ErrDeadline), Err: ctxErr(ctx)}
			r.outcome[j.key.Hash] = BlockResult{Status: StatusFailed, Err: err}
			if r.joinErr == nil {
				r.joinErr = err
			}
		}
	}
	return retry
}
