package requester

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/store"
)

// The fetch path, one file per phase, in the order a prefetch walks them:
//   - fetch.go: the boundary (runFetch), the outcome (fetchOut) and the
//     connect phase (connect, channelReady, ensureCurrent);
//   - window.go: the pipeline of lock windows and the lock phase (query,
//     lock, releaseQuery for a lost answer, plan of the answer);
//   - transfer.go: one window's lease and its renewer, the stage phase
//     (stage, buildOps) and the read phase (read, readFailed, innocent);
//   - commit.go: the commit and release phase (release, index, and
//     keepConfirmed for a read cut short);
//   - guard.go, partial.go, keep.go: the lock guard, the read tracker and
//     the keep set those phases share.

// fetchOut is the outcome of one fetch, aligned with the keys it was given.
type fetchOut struct {
	status  []Status
	errs    []error
	bytes   uint64
	session string
}

func newFetchOut(n int) fetchOut {
	return fetchOut{status: make([]Status, n), errs: make([]error, n)}
}

// failRest marks every block without a final status as failed (or
// discarded) with err.
func (o *fetchOut) failRest(st Status, err error) {
	for i := range o.status {
		if o.status[i] == 0 || o.status[i] == StatusFailed {
			o.status[i], o.errs[i] = st, err
		}
	}
}

// runFetch is the Prefetch boundary of the fetch path: a panic below it is
// recovered and turned into a failed fetch (the guard has already released
// the lock by then), never a crashed daemon.
func (e *Engine) runFetch(ctx context.Context, st *fetchState, keys []store.Key) (out fetchOut, err error) {
	out = newFetchOut(len(keys))
	defer func() {
		if r := recover(); r != nil {
			e.log.Error().Str("req_id", st.reqID).Str("remote", st.peer).Str("session", out.session).
				Str("phase", st.getPhase()).Interface("panic", r).Str("stack", string(debug.Stack())).
				Msg("panic in fetch path recovered; the fetch fails")
			err = &FetchError{Peer: st.peer, Phase: st.getPhase(), Err: fmt.Errorf("%w: %v", ErrPanic, r)}
			out.failRest(StatusFailed, err)
		}
	}()
	err = e.fetch(ctx, st, keys, &out)
	if err != nil {
		status := StatusFailed
		if errors.Is(err, ErrDiscarded) {
			status = StatusDiscarded
		}
		out.failRest(status, err)
	}
	return out, err
}

// defaultReconnectWait bounds how long a fetch waits for the peer's
// channel to be ready before its lock query, and before its one handshake
// retry.
const defaultReconnectWait = 2 * time.Second

// connect runs the connect phase: the connection and the peer client.
// The lock query (pipeline.lockWindow) follows it.
//
// A lock query is sent at most once (only a refusal at a pin limit, which
// locked nothing, is asked again, smaller). gRPC answers Unavailable both when
// the channel could not carry it (a channel in reconnect backoff right
// after a link came back fails at once with the cut-time dial error) and
// when the connection broke after the holder got it ("transport is
// closing"): the holder may have granted a session whose answer was lost,
// and a second query would open another one (that one is released by its
// query id: releaseQuery). So the channel is made ready before the query
// (told to reconnect now, within Engine.reconnectWait) instead of
// retrying after it. The handshake is retried once on such an error
// (without a pegad reason): a holder keeps one connection per requester
// node, a repeated handshake retires the earlier one (freed within its
// drain time), and it locks nothing.
func (e *Engine) connect(ctx context.Context, st *fetchState) (rd reader, client pegadv1.PeerServiceClient, err error) {
	e.hook(ctx, st, PhaseConnect)
	if client, err = e.peers(st.peer); err != nil {
		return rd, client, err
	}
	rd, err = e.conns.Get(ctx, st.peer)
	if err != nil && channelDown(err) && ctx.Err() == nil {
		// The handshake found the peer's channel down (client's channel
		// carried it). Repeating a handshake is safe (the holder keeps one
		// connection per requester node), so ready the channel and try once
		// more; the lock query is never repeated.
		if rerr := e.channelReady(ctx, client); rerr != nil {
			e.log.Info().Err(err).AnErr("reconnect", rerr).Str("req_id", st.reqID).Str("remote", st.peer).
				Msg("peer channel down at the handshake and not back within the reconnect wait")
			return rd, client, err
		}
		e.log.Info().Err(err).Str("req_id", st.reqID).Str("remote", st.peer).
			Msg("peer channel was down at the handshake; reconnected, handshaking once more")
		rd, err = e.conns.Get(ctx, st.peer)
	}
	return rd, client, err
}

// channelNotReady is the error of a lock query not sent because the peer's
// channel did not come ready: a connection error, as the query would have
// had, not the fetch's deadline (the reconnect wait ended, not ctx).
func channelNotReady(wait time.Duration, err error) error {
	return status.Errorf(codes.Unavailable, "peer channel not ready within %v, lock query not sent: %v", wait, err)
}

// channelReady makes client's channel, when it can be told to (peer.Clients'
// clients can), connect now and waits until it is ready, at most
// Engine.reconnectWait; at once when it is ready already.
func (e *Engine) channelReady(ctx context.Context, client pegadv1.PeerServiceClient) error {
	rc, ok := client.(reconnecter)
	if !ok {
		return nil
	}
	rctx, cancel := context.WithTimeout(ctx, e.reconnectWait)
	defer cancel()
	return rc.Reconnect(rctx)
}

// channelDown reports whether err says the peer's gRPC channel could not
// carry the RPC: Unavailable without a pegad reason (a holder's own
// refusals, DRAINING, carry one) and not a handshake the holder rejected.
func channelDown(err error) bool {
	if errors.Is(err, conn.ErrHandshakeRejected) {
		return false
	}
	code, reason := pegaderr.FromStatus(err)
	return code == codes.Unavailable && reason == ""
}

// incarnated is a connection that knows which incarnation of the holder it
// handshook with (*conn.AddrConnection does).
type incarnated interface{ RemoteIncarnation() string }

// ensureCurrent returns rd when it was handshaken with holderInc (or either
// side does not say), else invalidates it and connects again.
func (e *Engine) ensureCurrent(ctx context.Context, st *fetchState, rd reader, holderInc string) (reader, error) {
	ic, ok := rd.(incarnated)
	if !ok || holderInc == "" || ic.RemoteIncarnation() == "" || ic.RemoteIncarnation() == holderInc {
		return rd, nil
	}
	stale := fmt.Errorf("%w: handshook with incarnation %q, holder now answers as %q",
		conn.ErrPeerRestarted, ic.RemoteIncarnation(), holderInc)
	e.log.Info().Str("remote", st.peer).Str("req_id", st.reqID).Str("old_incarnation", ic.RemoteIncarnation()).
		Str("incarnation", holderInc).Msg("holder restarted since handshake; reconnecting before the read")
	e.conns.Invalidate(rd, stale)
	nrd, err := e.conns.Get(ctx, st.peer)
	if err != nil {
		return nil, err
	}
	if nic, ok := nrd.(incarnated); ok && nic.RemoteIncarnation() != holderInc {
		return nil, fmt.Errorf("%w: reconnected to incarnation %q, lock taken from %q",
			conn.ErrPeerRestarted, nic.RemoteIncarnation(), holderInc)
	}
	return nrd, nil
}
