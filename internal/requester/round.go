package requester

import (
	"context"

	"github.com/pegaflow/pegad/internal/store"
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

type joinedBlock struct {
	key store.Key
	f   *flight
}

// round sorts pending hashes into already local, owned (this call fetches
// them) and joined (another call is fetching them from the same peer),
// fetches the owned, waits for the joined, and returns the hashes to try
// again: joined blocks whose owner gave up (its own cancel or shorter
// deadline) while this call's ctx is still fine.
func (r *prefetchRun) round(ctx context.Context, pending [][]byte) (retry [][]byte) {
	e, st := r.e, r.st
	var owned []store.Key
	var ownedFlights []*flight // nil where the block is fetched unregistered
	var joined []joinedBlock
	e.mu.Lock()
	for _, h := range pending {
		key := store.Key{Namespace: st.ns, Hash: string(h)}
		f, inFlight := e.flights[key]
		switch {
		case inFlight && f.peer == st.peer:
			joined = append(joined, joinedBlock{key, f})
		case inFlight:
			// Being fetched from another peer, which may not have it:
			// fetch it from ours too (Insert keeps the first copy).
			owned = append(owned, key)
			ownedFlights = append(ownedFlights, nil)
		case e.store.Has(key):
			// Checked under mu: an owner deletes its flight only after
			// indexing, so a block is either in flight or visible here.
			r.outcome[string(h)] = BlockResult{Status: StatusAlreadyLocal}
		default:
			f := &flight{peer: st.peer, done: make(chan struct{}), status: StatusFailed, err: ErrPanic}
			e.flights[key] = f
			owned = append(owned, key)
			ownedFlights = append(ownedFlights, f)
		}
	}
	e.mu.Unlock()

	if len(owned) > 0 {
		r.fetched = true
		var out fetchOut
		var ferr error
		func() {
			// Joiners must never wait forever: complete every owned flight
			// whatever happens in the fetch.
			defer func() {
				gone := ctx.Err() != nil
				e.mu.Lock()
				for i, key := range owned {
					f := ownedFlights[i]
					if f == nil {
						continue
					}
					if i < len(out.status) {
						f.status, f.err = out.status[i], out.errs[i]
					}
					f.ownerGone = gone
					delete(e.flights, key)
					close(f.done)
				}
				e.mu.Unlock()
			}()
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
