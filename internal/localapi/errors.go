package localapi

import (
	"context"
	"fmt"
	"slices"

	"google.golang.org/grpc/codes"

	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/handoff"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
)

// invalidf is the status of a malformed request: InvalidArgument, reason
// INVALID; nothing changed.
func invalidf(format string, a ...any) error {
	return statusf(codes.InvalidArgument, pegaderr.Invalid, format, a...)
}

// statusf is a status error with code and a pegaderr reason: every error
// the local and admin APIs answer carries one (clients branch on it).
func statusf(code codes.Code, reason pegaderr.Reason, format string, a ...any) error {
	return pegaderr.Status(code, reason, fmt.Sprintf(format, a...)).Err()
}

// toStatus maps an internal error to a gRPC status with its pegaderr
// reason. It is the only place the local and admin APIs turn sentinels
// into codes; everything below this boundary returns wrapped sentinels.
func toStatus(err error) error { return pegaderr.ToStatus(err, statusKinds) }

// statusKinds: the first row an error matches wins.
var statusKinds = slices.Concat([]pegaderr.Kind{
	// A failed prefetch's class first: its cause may be a context error
	// (a transfer deadline cancels the read) that says less.
	{Err: requester.ErrInvalidInput, Code: codes.InvalidArgument, Reason: pegaderr.Invalid},
	// Before the index rows: a peer the index could not check is refused.
	{Err: requester.ErrUnknownPeer, Code: codes.PermissionDenied, Reason: pegaderr.UnknownPeer},
	{Err: requester.ErrDeadline, Code: codes.DeadlineExceeded, Reason: pegaderr.Deadline},
	{Err: requester.ErrLocalResource, Code: codes.ResourceExhausted, Reason: pegaderr.LocalResource},
	{Err: requester.ErrDiscarded, Code: codes.Aborted, Reason: pegaderr.Discarded},
	{Err: requester.ErrAuthentication, Code: codes.PermissionDenied, Reason: pegaderr.Authentication},
	{Err: requester.ErrConnection, Code: codes.Unavailable, Reason: pegaderr.Connection},
	{Err: requester.ErrRemote, Code: codes.FailedPrecondition, Reason: pegaderr.Remote},
	{Err: index.ErrDisabled, Code: codes.FailedPrecondition, Reason: pegaderr.IndexDisabled},
	{Err: index.ErrUnavailable, Code: codes.Unavailable, Reason: pegaderr.IndexUnavailable},
	{Err: context.DeadlineExceeded, Code: codes.DeadlineExceeded, Reason: pegaderr.Deadline},
	{Err: context.Canceled, Code: codes.Canceled, Reason: pegaderr.Canceled},
	{Err: store.ErrNotFound, Code: codes.NotFound, Reason: pegaderr.NotFound},
	// store.ErrNoSpace is pool.ErrNoSpace: one row covers a full pool
	// reported by either layer.
	{Err: store.ErrNoSpace, Code: codes.ResourceExhausted, Reason: pegaderr.NoSpace},
	{Err: store.ErrInvalid, Code: codes.InvalidArgument, Reason: pegaderr.Invalid},
	{Err: pool.ErrInvalid, Code: codes.InvalidArgument, Reason: pegaderr.Invalid},
	{Err: handoff.ErrMissing, Code: codes.NotFound, Reason: pegaderr.NotFound},
	{Err: handoff.ErrInvalid, Code: codes.InvalidArgument, Reason: pegaderr.Invalid},
	{Err: handoff.ErrLimit, Code: codes.ResourceExhausted, Reason: pegaderr.Limit},
	{Err: handoff.ErrDraining, Code: codes.Unavailable, Reason: pegaderr.Draining},
}, holder.StatusKinds, []pegaderr.Kind{
	{Err: conn.ErrConnectionBroken, Code: codes.Unavailable, Reason: pegaderr.Connection},
	{Err: conn.ErrSessionInvalidated, Code: codes.Unavailable, Reason: pegaderr.Connection},
	{Err: conn.ErrHandshakeRejected, Code: codes.Unavailable, Reason: pegaderr.Connection},
	{Err: conn.ErrClosed, Code: codes.Unavailable, Reason: pegaderr.Connection},
	{Err: conn.ErrRemoteMemory, Code: codes.FailedPrecondition, Reason: pegaderr.Remote},
})
