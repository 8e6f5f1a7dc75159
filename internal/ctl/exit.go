package ctl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegaclient "github.com/pegaflow/pegad/client"
)

// Exit codes, documented in docs/pegactl.md. Scripts branch on them.
const (
	ExitOK          = 0
	ExitError       = 1 // any other failure
	ExitUsage       = 2 // bad flags, arguments or input files; InvalidArgument from pegad
	ExitNotFound    = 3 // the block, session or peer block does not exist
	ExitUnavailable = 4 // pegad cannot be reached on --socket, or it answered Unavailable (retryable)
	ExitPermission  = 5 // the socket exists but this user may not connect, or a peer refused a certificate (not retryable)
)

// exitError carries an exit code chosen by the command itself.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErrorf(format string, args ...any) error {
	return &exitError{code: ExitUsage, err: fmt.Errorf(format, args...)}
}

func notFoundErrorf(format string, args ...any) error {
	return &exitError{code: ExitNotFound, err: fmt.Errorf(format, args...)}
}

// unavailableMsg says pegad could not be reached, where we looked and why.
func unavailableMsg(socket, cause string) string {
	return fmt.Sprintf("cannot reach pegad at %s: %s (is pegad running? set --socket or %s)",
		socket, cause, EnvSocket)
}

// classify is pegactl's one map from an error to its exit code and the
// message printed after "Error: " (docs/pegactl.md, "Errors and exit
// codes"), in this order:
//   - a code the command chose itself (usageErrorf, notFoundErrorf);
//   - a socket the client could not dial (pegaclient.SocketError):
//     permission denied, else unavailable;
//   - an error cobra made (not from a command's RunE): usage;
//   - the client's typed errors that carry no gRPC status (the data
//     socket's answers);
//   - a deadline: ExitError, "timed out";
//   - a gRPC status, from pegad or a peer (grpcExit);
//   - anything else: ExitError.
func classify(err error) (int, string) {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code, ee.err.Error()
	}
	var se *pegaclient.SocketError
	if errors.As(err, &se) {
		if errors.Is(se.Err, fs.ErrPermission) {
			pe := &permissionError{socket: se.Socket, group: socketGroup(se.Socket)}
			return ExitPermission, pe.Error()
		}
		return ExitUnavailable, unavailableMsg(se.Socket, se.Cause())
	}
	if !isRunError(err) {
		// Produced by cobra itself: unknown flag, missing required flag,
		// wrong number of arguments.
		return ExitUsage, err.Error()
	}
	var gs interface{ GRPCStatus() *status.Status }
	isStatus := errors.As(err, &gs)
	if !isStatus {
		// The data socket's answers (those of gRPC calls keep their
		// status and are classified from it, below).
		switch {
		case errors.Is(err, pegaclient.ErrNotFound):
			return ExitNotFound, err.Error()
		case errors.Is(err, pegaclient.ErrInvalid):
			return ExitUsage, err.Error()
		case errors.Is(err, pegaclient.ErrUnavailable):
			return ExitUnavailable, err.Error()
		}
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ExitError, "timed out (raise --timeout)"
	}
	if isStatus {
		return grpcExit(gs.GRPCStatus())
	}
	return ExitError, err.Error()
}

// grpcExit turns a gRPC status into an exit code and its message alone:
// pegad's messages are written for operators ("block not found: ..."), the
// "rpc error: code = ... desc = " wrapping is not.
func grpcExit(st *status.Status) (int, string) {
	msg := cleanError(st.Message())
	switch st.Code() {
	case codes.NotFound:
		return ExitNotFound, msg
	case codes.InvalidArgument:
		return ExitUsage, msg
	case codes.Unavailable:
		// pegad answered Unavailable (e.g. a peer's connection broke
		// during prefetch) or the socket connection dropped mid-call.
		return ExitUnavailable, msg
	case codes.PermissionDenied, codes.Unauthenticated:
		// A certificate refused between pegad and a peer (prefetch):
		// retrying the same certificates cannot succeed.
		return ExitPermission, msg
	case codes.DeadlineExceeded:
		return ExitError, "timed out: " + msg + " (raise --timeout)"
	case codes.Unimplemented:
		return ExitError, "pegad does not implement this: " + msg
	default:
		return ExitError, msg
	}
}
