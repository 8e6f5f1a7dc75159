package requester

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/peertls"
	"github.com/pegaflow/pegad/internal/pool"
)

// Error classes of a failed fetch (docs/lessons.md L7). Every error Prefetch returns
// for a failed fetch is a *FetchError that errors.Is one of these (except a
// cancellation, which is errors.Is context.Canceled) and also wraps the
// underlying cause, so callers can branch on either.
var (
	// ErrConnection: the RDMA connection or the peer's gRPC port is broken.
	// The only class that invalidates the connection.
	ErrConnection = errors.New("connection broken")
	// ErrLocalResource: this node could not stage the blocks (pool full even
	// after eviction). The connection stays up.
	ErrLocalResource = errors.New("local resource exhausted")
	// ErrRemote: the holder refused the request or answered nonsense.
	ErrRemote = errors.New("remote refused")
	// ErrDeadline: the caller's deadline or the transfer deadline derived
	// from the holder's lock timeout passed.
	ErrDeadline = errors.New("deadline exceeded")
	// ErrInvalidInput: the request itself is malformed; nothing was sent.
	ErrInvalidInput = errors.New("invalid input")
	// ErrAuthentication: the peer refused this node's certificate, or this
	// node refused the peer's (mTLS, --peer-allow, a node id the
	// certificate does not prove). A permission problem, not retryable
	// until a certificate, a CA or an allow-list changes; the peer is not
	// redialled meanwhile (peer.Clients).
	ErrAuthentication = errors.New("certificate refused")
	// ErrUnknownPeer: a prefetch with Request.KnownPeerOnly named a peer
	// that is not a known node (not live in the cluster index, and no
	// --peer-allow checks it); nothing was sent to it.
	ErrUnknownPeer = errors.New("unknown peer refused")
)

// noPeerCheck says why a peer cannot be checked at all.
const noPeerCheck = "no cluster index and no --peer-allow to check it against"

// Outcomes that are not error classes.
var (
	// ErrDiscarded: the holder said at release time that the lock had lapsed
	// during the read (was_live=false); what was read is dropped (docs/lessons.md L10).
	ErrDiscarded = errors.New("requester: lock lapsed during the read; fetched data discarded")
	// ErrPanic: a panic in the fetch path was recovered; the fetch failed.
	ErrPanic = errors.New("requester: panic in fetch path")
	// errClosed: the engine is shut down. Unexported: a fetch it ends is
	// errors.Is context.Canceled, and callers branch on that.
	errClosed = errors.New("requester: engine closed")
)

// errTransferDeadline cancels a Read that outlives the lock's deadline.
var errTransferDeadline = errors.New("transfer deadline (lock timeout minus safety margin) passed")

// Class labels of metrics.FetchErrors.
const (
	classConnection = "connection"
	classLocal      = "local_resource"
	classRemote     = "remote"
	classDeadline   = "deadline"
	classInvalid    = "invalid"
	classAuth       = "authentication"
)

func classLabel(class error) string {
	switch class {
	case ErrConnection:
		return classConnection
	case ErrLocalResource:
		return classLocal
	case ErrRemote:
		return classRemote
	case ErrDeadline:
		return classDeadline
	case ErrInvalidInput:
		return classInvalid
	case ErrAuthentication:
		return classAuth
	}
	return ""
}

// FetchError is a failed fetch: the phase it failed in, its class (one of
// the Err* class sentinels; nil for a cancellation or a panic) and cause.
type FetchError struct {
	Peer  string
	Phase string
	Class error
	Err   error
}

func (e *FetchError) Error() string {
	s := "requester: prefetch"
	if e.Peer != "" {
		s += " from " + e.Peer
	}
	if e.Phase != "" {
		s += ": " + e.Phase
	}
	if e.Class != nil {
		s += " (" + e.Class.Error() + ")"
	}
	return s + ": " + causeText(e.Err, e.Peer)
}

// grpcWrapping is the text a gRPC status gets when it is formatted.
var grpcWrapping = regexp.MustCompile(`rpc error: code = \w+ desc = `)

// transportWrapping is what gRPC puts around a failure to connect (a TLS
// handshake's, a dial's): `connection error: desc = "transport: ..."`.
var transportWrapping = regexp.MustCompile(`connection error: desc = "transport: (.*)"`)

// causeText is err's text for an operator: one cause, said once. gRPC's
// "rpc error: code = ... desc =" wrapping goes, and so does conn's own
// "conn: read from PEER:" (the FetchError names the peer already). A
// peer that closed or reset the connection is said so in words first.
func causeText(err error, peer string) string {
	s := grpcWrapping.ReplaceAllString(err.Error(), "")
	s = transportWrapping.ReplaceAllString(s, "$1")
	if peer != "" {
		s = strings.ReplaceAll(s, "conn: read from "+peer+": ", "")
	}
	s = strings.ReplaceAll(s, "conn: conn: ", "conn: ")
	// A refused certificate: its own words only, not the transport's
	// ("connection error: desc = \"transport: authentication handshake
	// failed: ...\"", "error reading server preface: ...").
	if i := strings.Index(s, peertls.ErrRefused.Error()+": "); i >= 0 {
		return strings.TrimRight(s[i+len(peertls.ErrRefused.Error())+2:], `"`)
	}
	switch {
	case errors.Is(err, ibv.ErrPeerClosed):
		// The data connection's completion failed (RETRY_EXC_ERR, as an
		// HCA reports a vanished peer) and the transport saw why.
		return "peer closed the connection (" + strings.Replace(s, ": "+ibv.ErrPeerClosed.Error(), "", 1) + ")"
	case strings.Contains(s, "connection reset by peer"), strings.Contains(s, "broken pipe"),
		strings.HasSuffix(s, ": EOF"), strings.Contains(s, "error reading from server: EOF"):
		return "peer closed the connection (" + s + ")"
	case strings.Contains(s, "connection refused"):
		return "peer refused the connection (connection refused): is pegad running there?"
	}
	return s
}

// Unwrap exposes both the class and the cause to errors.Is / errors.As.
func (e *FetchError) Unwrap() []error {
	if e.Class == nil {
		return []error{e.Err}
	}
	return []error{e.Class, e.Err}
}

// classify maps a cause to its class. fallback is the class of errors this
// call site cannot otherwise recognise. A nil class means cancellation.
func classify(err, fallback error) error {
	switch {
	case errors.Is(err, ErrInvalidInput):
		return ErrInvalidInput
	case peertls.IsRefusal(err):
		// Before the connection classes and codes: a refused TLS
		// handshake reaches us as Unavailable (or a rejected RDMA
		// handshake wrapping it), which would say "retry".
		return ErrAuthentication
	case errors.Is(err, errTransferDeadline), errors.Is(err, context.DeadlineExceeded):
		return ErrDeadline
	case errors.Is(err, context.Canceled), errors.Is(err, errClosed):
		return nil
	case errors.Is(err, pool.ErrNoSpace), errors.Is(err, pool.ErrInvalid), // store.ErrNoSpace is pool.ErrNoSpace
		errors.Is(err, conn.ErrInvalidOp): // staging outside registered memory: ours, not the link's
		return ErrLocalResource
	case errors.Is(err, conn.ErrConnectionBroken), errors.Is(err, conn.ErrSessionInvalidated),
		errors.Is(err, conn.ErrRemoteMemory), errors.Is(err, conn.ErrHandshakeRejected),
		errors.Is(err, conn.ErrPeerRestarted):
		return ErrConnection
	case errors.Is(err, conn.ErrClosed):
		return nil // the daemon is shutting down
	}
	if st, ok := status.FromError(err); ok && err != nil {
		switch st.Code() {
		case codes.Unavailable:
			return ErrConnection
		case codes.DeadlineExceeded:
			return ErrDeadline
		case codes.Canceled:
			return nil
		default:
			return ErrRemote
		}
	}
	return fallback
}

// invalidates reports whether err proves the RDMA connection unusable.
// Only connection-class causes from the data path do (docs/lessons.md L7): a local
// allocation failure or a refused RPC leaves a healthy connection up.
func invalidates(err error) bool {
	return errors.Is(err, conn.ErrConnectionBroken) || errors.Is(err, conn.ErrSessionInvalidated) ||
		errors.Is(err, conn.ErrRemoteMemory) || errors.Is(err, conn.ErrPeerRestarted)
}

// reclaimedRelease reports whether a release was refused because the
// holder has seen a newer incarnation of this node: it refuses a stale
// incarnation only after it reclaimed every session of it, so the lock is
// known to be gone, not leaked. A holder that sends no pegaderr reason
// says so with FailedPrecondition alone.
func reclaimedRelease(err error) bool {
	code, reason := pegaderr.FromStatus(err)
	return reason == pegaderr.StaleIncarnation || (reason == "" && code == codes.FailedPrecondition)
}

// ctxErr is the error of a done ctx: its Err, also wrapping its cause when
// that differs (errClosed at shutdown, errTransferDeadline).
func ctxErr(ctx context.Context) error {
	err, cause := ctx.Err(), context.Cause(ctx)
	if cause == nil || cause == err {
		return err
	}
	return fmt.Errorf("%w: %w", err, cause)
}
