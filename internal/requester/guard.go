package requester

import (
	"context"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// lockGuard releases one transfer session exactly once (docs/lessons.md L3). The fetch
// creates it right after a successful QueryBlocksForTransfer and defers
// Abort; the normal path calls Release. Whichever runs first releases, the
// other is a no-op (sync.Once), so a panic, a cancellation or a shutdown
// between the lock and the normal release still releases the session, and
// no path releases twice.
//
// Both paths release with a fresh context bounded by the engine's release
// timeout: the fetch's own context may be the reason it is leaving.
type lockGuard struct {
	e      *Engine
	client pegadv1.PeerServiceClient
	st     *fetchState
	sid    string

	once sync.Once
	// Written inside once, read after it.
	resp *pegadv1.ReleaseTransferLockResponse
	err  error
	// retried: the answer came from a second or later attempt, after one
	// whose reply was lost (the holder may have executed it).
	retried bool
}

func (e *Engine) newGuard(client pegadv1.PeerServiceClient, st *fetchState, sid string) *lockGuard {
	return &lockGuard{e: e, client: client, st: st, sid: sid}
}

// Release is the normal release (success or a handled error). Later calls
// return the first call's result.
func (g *lockGuard) Release() (*pegadv1.ReleaseTransferLockResponse, error) {
	g.once.Do(func() { g.resp, g.err = g.release(false) })
	return g.resp, g.err
}

// Complete is Release after the session's blocks were read in full: the
// release says so (read_complete), and a handoff the query named ends its
// pin of them on the holder.
func (g *lockGuard) Complete() (*pegadv1.ReleaseTransferLockResponse, error) {
	g.once.Do(func() { g.resp, g.err = g.release(true) })
	return g.resp, g.err
}

// Abort releases the session if nothing has yet: the fetch is leaving on an
// abnormal path (panic, cancellation, shutdown). That is logged at WARN and
// counted, so any remaining abort path is visible in production.
func (g *lockGuard) Abort(reason string) {
	g.once.Do(func() {
		g.e.m.GuardAborts.Inc()
		g.e.log.Warn().Str("session", g.sid).Str("remote", g.st.peer).Str("req_id", g.st.reqID).
			Str("phase", g.st.getPhase()).Str("reason", reason).
			Msg("transfer lock released by guard on abnormal exit of a fetch")
		g.resp, g.err = g.release(false)
	})
}

// release sends ReleaseTransferLock, retrying transient failures within the
// release timeout (the holder's release is idempotent); read says the
// session's blocks were read in full. A release that still fails is
// counted; the holder's GC reclaims the session.
func (g *lockGuard) release(read bool) (*pegadv1.ReleaseTransferLockResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), g.e.releaseTimeout)
	defer cancel()
	req := &pegadv1.ReleaseTransferLockRequest{
		SessionId:    g.sid,
		RequesterId:  g.e.opts.NodeID,
		Requester:    g.e.requester(),
		ReadComplete: read,
	}
	var err error
	backoff := 10 * time.Millisecond
	for attempt := 1; ; attempt++ {
		var resp *pegadv1.ReleaseTransferLockResponse
		resp, err = g.client.ReleaseTransferLock(ctx, req)
		if err == nil {
			g.retried = attempt > 1
			return resp, nil
		}
		if attempt >= 3 || !retryableRelease(err) {
			break
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
		if ctx.Err() != nil {
			break
		}
		backoff *= 4
	}
	if reclaimedRelease(err) {
		// Not a failure to release: the holder already ended the session
		// when it saw this node's newer incarnation.
		g.e.log.Warn().Err(err).Str("session", g.sid).Str("remote", g.st.peer).Str("req_id", g.st.reqID).
			Str("incarnation", g.e.opts.Incarnation).
			Msg("transfer lock release refused: the holder reclaimed this incarnation's sessions")
		return nil, err
	}
	g.e.m.GuardReleaseFails.Inc()
	g.e.log.Warn().Err(err).Str("session", g.sid).Str("remote", g.st.peer).Str("req_id", g.st.reqID).
		Msg("transfer lock release failed; the holder's GC will reclaim the session")
	return nil, err
}

// releasedLive reports whether the session was live when this guard
// released it. Besides was_live, a retried release that answers
// ALREADY_RELEASED counts: only the owner can release, so an earlier
// attempt of ours ended the live session and only its reply was lost.
func (g *lockGuard) releasedLive(resp *pegadv1.ReleaseTransferLockResponse) bool {
	if resp.GetWasLive() {
		return true
	}
	return g.retried && resp.GetEnd() == pegadv1.SessionEnd_SESSION_END_ALREADY_RELEASED
}

func retryableRelease(err error) bool {
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted:
		return true
	}
	return false
}
