package ctl

import (
	"context"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
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

// unavailableError says pegad could not be reached, and where we looked.
type unavailableError struct {
	socket string
	cause  string
}

func (e *unavailableError) Error() string {
	return fmt.Sprintf("cannot reach pegad at %s: %s (is pegad running? set --socket or %s)",
		e.socket, e.cause, EnvSocket)
}

// classify maps an error from the command tree to an exit code and the
// message printed after "Error: ".
func classify(err error) (int, string) {
	var ee *exitError
	if errors.As(err, &ee) {
		return ee.code, ee.err.Error()
	}
	var pe *permissionError
	if errors.As(err, &pe) {
		return ExitPermission, pe.Error()
	}
	var ue *unavailableError
	if errors.As(err, &ue) {
		return ExitUnavailable, ue.Error()
	}
	if !isRunError(err) {
		// Produced by cobra itself: unknown flag, missing required flag,
		// wrong number of arguments.
		return ExitUsage, err.Error()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return ExitError, "timed out (raise --timeout)"
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return grpcExit(se.GRPCStatus())
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
