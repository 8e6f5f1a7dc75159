// Package pegaderr is pegad's typed-error contract on gRPC, for both of
// its APIs (the peer port and the local socket). A failed call's status
// carries a google.rpc.ErrorInfo in Domain whose reason names what failed,
// so a client branches on the kind of error rather than on a gRPC code
// several kinds share (FailedPrecondition is a stale incarnation, a used-up
// lifetime or a standalone node).
//
// ToStatus is the one encoder every server uses, driven by a table of
// (sentinel, code, reason) that the package owning the sentinels keeps;
// FromStatus is the one decoder every client uses. It depends on nothing
// of pegad's internals, so the public client can import it; it never
// decides what an error means beyond the table it is given.
package pegaderr

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the ErrorInfo domain of pegad's reasons.
const Domain = "pegad.pegaflow.io"

// Reason names an error kind on the wire (ErrorInfo.reason). Stable: a
// client may compare against these.
type Reason string

// Reasons. A status without one (an older pegad, or an error outside the
// tables) still has its code.
const (
	// Blocks and the pool (local socket).
	NotFound Reason = "NOT_FOUND" // no such block
	NoSpace  Reason = "NO_SPACE"  // the pool is full even after eviction
	Invalid  Reason = "INVALID"   // the request is malformed; nothing changed
	Canceled Reason = "CANCELED"  // the caller's context ended
	Deadline Reason = "DEADLINE"  // a deadline passed
	Internal Reason = "INTERNAL"  // a bug or an unexpected failure
	// A block deleted or replaced while a streaming get read it; read it
	// again.
	BlockChanged Reason = "BLOCK_CHANGED"
	Limit        Reason = "LIMIT"    // a per-peer or node limit refused the request
	Draining     Reason = "DRAINING" // the node is shutting down; try another
	Identity     Reason = "IDENTITY" // a claimed node id the certificate does not prove
	// An RDMA handshake the holder could not complete (its resources, the
	// connect); it left nothing behind and may be retried.
	HandshakeAborted Reason = "HANDSHAKE_ABORTED"
	// A certificate refused on the peer port: the holder's CA did not sign
	// the requester's, it is off --peer-allow, or the requester refused the
	// holder's. Not retryable until a certificate or a list changes.
	Authentication Reason = "AUTHENTICATION"

	// Transfer sessions (peer port; admin force-release).
	InvalidSessionID  Reason = "INVALID_SESSION_ID"
	UnknownSession    Reason = "UNKNOWN_SESSION"    // not live, not remembered
	SessionEnded      Reason = "SESSION_ENDED"      // not live; the message says how it ended
	NotOwner          Reason = "NOT_OWNER"          // the session is another requester's
	StaleIncarnation  Reason = "STALE_INCARNATION"  // the holder saw a newer start of this node
	LifetimeExhausted Reason = "LIFETIME_EXHAUSTED" // no renewal left; live until its deadline

	// A failed prefetch, by class (local socket).
	Connection    Reason = "CONNECTION"     // the link or the peer's port is broken
	LocalResource Reason = "LOCAL_RESOURCE" // this node could not stage the blocks
	Remote        Reason = "REMOTE"         // the holder refused or answered nonsense
	Discarded     Reason = "DISCARDED"      // the lock lapsed during the read; data dropped

	// The cluster index.
	IndexDisabled    Reason = "INDEX_DISABLED"    // started without --cluster-redis
	IndexUnavailable Reason = "INDEX_UNAVAILABLE" // the index does not answer
	// A prefetch with known_peer_only named a peer that is not a known
	// node (not live in the cluster index, no --peer-allow to check it):
	// nothing was sent to it.
	UnknownPeer Reason = "UNKNOWN_PEER"
)

// Kind is one row of a server's table: an error that errors.Is Err
// answers Code with Reason.
type Kind struct {
	Err    error
	Code   codes.Code
	Reason Reason
}

// contextKinds end every table: a context error that none of the rows
// claimed keeps its own code.
var contextKinds = []Kind{
	{context.DeadlineExceeded, codes.DeadlineExceeded, Deadline},
	{context.Canceled, codes.Canceled, Canceled},
}

// ToStatus turns err into a status error for the wire: the first row of
// kinds (in order, so a more telling kind goes first) that err matches
// gives its code and reason, with err's text as the message. An error
// that matches no row but already carries a status (other than Unknown)
// passes unchanged; a context error keeps its code; any other is
// Internal. nil stays nil. The rows come first because an error can both
// match one and wrap a status: a failed prefetch's class wraps the peer's
// status that caused it, whose code says less (a refused certificate
// reaches the requester as Unavailable).
func ToStatus(err error, kinds []Kind) error {
	if err == nil {
		return nil
	}
	if k, ok := match(err, kinds); ok {
		return Status(k.Code, k.Reason, err.Error()).Err()
	}
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return err
	}
	if k, ok := match(err, contextKinds); ok {
		return Status(k.Code, k.Reason, err.Error()).Err()
	}
	return Status(codes.Internal, Internal, err.Error()).Err()
}

// match is the first row of kinds that err matches.
func match(err error, kinds []Kind) (Kind, bool) {
	for _, k := range kinds {
		if errors.Is(err, k.Err) {
			return k, true
		}
	}
	return Kind{}, false
}

// Status is a status with code, message msg and reason in its details.
func Status(code codes.Code, reason Reason, msg string) *status.Status {
	s := status.New(code, msg)
	if reason == "" {
		return s
	}
	d, err := s.WithDetails(&errdetails.ErrorInfo{Reason: string(reason), Domain: Domain})
	if err != nil {
		return s // a code without details still says enough
	}
	return d
}

// FromStatus returns err's gRPC code and pegad reason ("" when it carries
// none; codes.OK and "" for nil). A non-status error is Unknown.
func FromStatus(err error) (codes.Code, Reason) {
	if err == nil {
		return codes.OK, ""
	}
	s, ok := status.FromError(err)
	if !ok {
		return codes.Unknown, ""
	}
	for _, d := range s.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			return s.Code(), Reason(info.GetReason())
		}
	}
	return s.Code(), ""
}
