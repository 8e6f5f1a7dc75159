package localapi

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/requester"
	"github.com/pegaflow/pegad/internal/store"
)

// toStatus maps an internal error to a gRPC status. It is the only place
// the local and admin APIs turn sentinels into codes; everything below
// this boundary returns wrapped sentinels.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return err
	}
	return status.Error(codeOf(err), err.Error())
}

func codeOf(err error) codes.Code {
	switch {
	// A failed prefetch's class first: its cause may be a context error
	// (a transfer deadline cancels the read) that says less.
	case errors.Is(err, requester.ErrInvalidInput):
		return codes.InvalidArgument
	case errors.Is(err, requester.ErrDeadline):
		return codes.DeadlineExceeded
	case errors.Is(err, requester.ErrLocalResource):
		return codes.ResourceExhausted
	case errors.Is(err, requester.ErrDiscarded):
		return codes.Aborted
	case errors.Is(err, requester.ErrConnection):
		return codes.Unavailable
	case errors.Is(err, requester.ErrRemote):
		return codes.FailedPrecondition
	case errors.Is(err, index.ErrDisabled):
		return codes.FailedPrecondition
	case errors.Is(err, index.ErrUnavailable):
		return codes.Unavailable
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, store.ErrNotFound):
		return codes.NotFound
	case errors.Is(err, store.ErrNoSpace), errors.Is(err, pool.ErrNoSpace):
		return codes.ResourceExhausted
	case errors.Is(err, store.ErrInvalid), errors.Is(err, pool.ErrInvalid):
		return codes.InvalidArgument
	case errors.Is(err, holder.ErrInvalidSessionID):
		return codes.InvalidArgument
	case errors.Is(err, holder.ErrUnknownSession), errors.Is(err, holder.ErrSessionEnded):
		return codes.NotFound
	case errors.Is(err, holder.ErrNotOwner):
		return codes.PermissionDenied
	case errors.Is(err, holder.ErrStaleIncarnation), errors.Is(err, holder.ErrLifetimeExhausted):
		return codes.FailedPrecondition
	case errors.Is(err, conn.ErrConnectionBroken), errors.Is(err, conn.ErrSessionInvalidated),
		errors.Is(err, conn.ErrHandshakeRejected), errors.Is(err, conn.ErrClosed):
		return codes.Unavailable
	case errors.Is(err, conn.ErrRemoteMemory):
		return codes.FailedPrecondition
	}
	return codes.Internal
}
