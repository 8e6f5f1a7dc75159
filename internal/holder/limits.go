package holder

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"

	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/metrics"
)

// Limits bound what peers may pin, so that one careless or hostile peer
// cannot keep the whole pool pinned (pinned blocks cannot be evicted, and
// local puts need evictable space). Zero means unlimited. Bytes count per
// session: a block two sessions pin counts twice, which errs on the safe
// side.
//
// They are checked when a query opens a session. A renewal pins nothing
// new, so it can never take a peer past a cap; it only keeps what was
// admitted, for at most MaxLifetime.
type Limits struct {
	SessionsPerPeer    int    // live sessions of one requester identity
	PinnedBytesPerPeer uint64 // bytes the live sessions of one identity pin
	PinnedBytes        uint64 // bytes the live sessions of all peers pin
}

// ErrLimit: the query would take its peer or the node past a limit (the
// message names it). Maps to ResourceExhausted; nothing was locked.
var ErrLimit = errors.New("limit reached")

// Authenticator returns the caller's authenticated identity (the name its
// sessions are owned under) and every name it proved; ok false when the
// call carries none. See Options.Authenticate.
type Authenticator func(ctx context.Context) (identity string, names []string, ok bool)

// ErrIdentity: the claimed requester node id is not one the caller's
// certificate proves. Maps to PermissionDenied.
var ErrIdentity = errors.New("claimed node id is not the authenticated identity")

// owner is who a request acts as. Without an Authenticator it is the node
// id the request claims (plaintext port: trusted network). With one, it is
// the certificate identity, and the claim must be one of the certificate's
// names: a peer can act only as itself.
func (s *Service) owner(ctx context.Context, claimed string) (string, error) {
	if s.opts.Authenticate == nil {
		return claimed, nil
	}
	id, names, ok := s.opts.Authenticate(ctx)
	if !ok {
		return "", pegaderr.Status(codes.Unauthenticated, pegaderr.Identity, "peer port requires an authenticated identity").Err()
	}
	for _, n := range names {
		if n == claimed {
			return id, nil
		}
	}
	s.opts.Metrics.PeerAuthRefused.WithLabelValues(metrics.AuthIdentityClaimed).Inc()
	s.opts.Log.Warn().Str("peer", id).Str("claimed", claimed).Str("reason", metrics.AuthIdentityClaimed).
		Msg("Peer refused: claimed node id is not its certificate identity")
	return "", toStatus(fmt.Errorf("%w: claimed %q, certificate proves %q", ErrIdentity, claimed, names))
}

// admitLocked checks the limits for a new session of n pinning bytes, with
// the sessions in leaving about to be reclaimed, and takes the bytes on
// success. n.mu is held.
func (t *LockTable) admitLocked(owner string, n *nodeState, bytes uint64, leaving []*session) error {
	l := t.limits
	sessions, pinned := n.sessions.len()-len(leaving), n.pinned
	for _, s := range leaving {
		pinned -= s.bytes
	}
	if l.SessionsPerPeer > 0 && sessions >= l.SessionsPerPeer {
		return t.refuse(metrics.LimitSessionsPerPeer, "peer %q has %d live sessions, limit %d: release some first",
			owner, sessions, l.SessionsPerPeer)
	}
	if l.PinnedBytesPerPeer > 0 && pinned+bytes > l.PinnedBytesPerPeer {
		return t.refuse(metrics.LimitPinnedBytesPerPeer, "peer %q pins %d bytes, this query %d more, limit %d",
			owner, pinned, bytes, l.PinnedBytesPerPeer)
	}
	total := t.pinnedBytes.Add(bytes)
	if l.PinnedBytes > 0 && total > l.PinnedBytes {
		t.pinnedBytes.Add(-bytes)
		return t.refuse(metrics.LimitPinnedBytesNode, "peers pin %d bytes of this node, this query %d more, limit %d",
			total-bytes, bytes, l.PinnedBytes)
	}
	n.pinned += bytes
	t.m.PeerPinnedBytes.Add(float64(bytes))
	return nil
}

// unadmit gives back what admitLocked took for s; n.mu held (n nil when
// the node state is gone).
func (t *LockTable) unadmit(n *nodeState, s *session) {
	if n != nil {
		n.pinned -= s.bytes
	}
	t.pinnedBytes.Add(-s.bytes)
	t.m.PeerPinnedBytes.Sub(float64(s.bytes))
}

func (t *LockTable) refuse(limit, format string, a ...any) error {
	t.m.PeerLimitRefused.WithLabelValues(limit).Inc()
	return fmt.Errorf("%w: %s: %s", ErrLimit, limit, fmt.Sprintf(format, a...))
}

// PinnedBytes is what live sessions pin in all (counted per session).
func (t *LockTable) PinnedBytes() uint64 { return t.pinnedBytes.Load() }
