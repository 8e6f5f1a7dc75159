package client

import (
	"errors"
	"fmt"
	"net"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/api/localwire"
	"github.com/pegaflow/pegad/api/pegaderr"
)

// Errors a caller branches on with errors.Is. Errors from gRPC calls also
// keep their status (status.Code still works on them).
var (
	ErrNotFound    = errors.New("pegad: block not found")
	ErrPoolFull    = errors.New("pegad: pool full")
	ErrInvalid     = errors.New("pegad: invalid request")
	ErrExists      = errors.New("pegad: block already stored")
	ErrLeaseEnded  = errors.New("pegad: lease ended (released, expired, or its connection closed)")
	ErrLimit       = errors.New("pegad: limit reached")
	ErrUnavailable = errors.New("pegad: daemon unavailable")
	ErrClosed      = errors.New("pegad: client closed")
	ErrProtocol    = errors.New("pegad: protocol error")
	ErrInternal    = errors.New("pegad: internal error")
	// ErrDenied: a pin token of another user's pin (Adopt, Pin.Release),
	// or a Prefetch with KnownPeerOnly whose peer is not a known node.
	ErrDenied = errors.New("pegad: denied")
	// ErrShortBuffer: Get's dst is smaller than the block (the returned
	// count is the size needed).
	ErrShortBuffer = errors.New("pegad: buffer shorter than the block")
	// ErrNoZeroCopy: Alloc or Lease on a client without the data socket
	// (dialled with AllowStreamFallback against a daemon that has none).
	ErrNoZeroCopy = errors.New("pegad: no data socket: zero-copy calls unavailable")
	// ErrAborted: a block changed or a stream ended early.
	ErrAborted = errors.New("pegad: aborted")
	// ErrNoIndex: a Prefetch without FromPeer on a daemon started
	// without a cluster index (--cluster-redis): name a peer.
	ErrNoIndex = errors.New("pegad: no cluster index (name a peer with FromPeer)")
)

// fromWire turns a failed item of the data socket into an error.
func fromWire(op localwire.Op, st localwire.Status, msg string) error {
	var sentinel error
	switch st {
	case localwire.StatusNotFound:
		sentinel = ErrNotFound
	case localwire.StatusPoolFull:
		sentinel = ErrPoolFull
	case localwire.StatusInvalid:
		sentinel = ErrInvalid
	case localwire.StatusExists:
		sentinel = ErrExists
	case localwire.StatusNoLease:
		sentinel = ErrLeaseEnded
	case localwire.StatusLimit:
		sentinel = ErrLimit
	case localwire.StatusClosed:
		sentinel = ErrUnavailable
	case localwire.StatusDenied:
		sentinel = ErrDenied
	default:
		sentinel = ErrInternal
	}
	// The daemon's message often is the sentinel's own words ("block not
	// found"): saying them twice ("pegad: block not found: block not
	// found") tells the reader nothing more.
	if msg == "" || "pegad: "+msg == sentinel.Error() {
		return fmt.Errorf("%v: %w", op, sentinel)
	}
	return fmt.Errorf("%v: %w: %s", op, sentinel, msg)
}

// notFound is ErrNotFound for one named block. It reads as the daemon's
// gRPC answer does ("block not found: namespace=NS hash=HEX"), so a caller
// and pegactl (docs/pegactl.md, exit 3) see the same words whichever path,
// the data socket or a gRPC stream, the call took.
func notFound(namespace string, hash []byte) error {
	return &keyError{
		sentinel: ErrNotFound,
		msg:      fmt.Sprintf("block not found: namespace=%s hash=%x", namespace, hash),
	}
}

// keyError is a typed error whose text names the block it is about.
type keyError struct {
	sentinel error
	msg      string
}

func (e *keyError) Error() string { return e.msg }
func (e *keyError) Unwrap() error { return e.sentinel }

// byReason is the typed error of each pegaderr reason the daemon sends.
var byReason = map[pegaderr.Reason]error{
	pegaderr.NotFound: ErrNotFound, pegaderr.UnknownSession: ErrNotFound, pegaderr.SessionEnded: ErrNotFound,
	pegaderr.NoSpace: ErrPoolFull, pegaderr.LocalResource: ErrPoolFull, pegaderr.Limit: ErrLimit,
	pegaderr.Invalid: ErrInvalid, pegaderr.InvalidSessionID: ErrInvalid,
	pegaderr.Draining: ErrUnavailable, pegaderr.Connection: ErrUnavailable, pegaderr.IndexUnavailable: ErrUnavailable,
	pegaderr.Discarded: ErrAborted, pegaderr.Internal: ErrInternal,
	pegaderr.IndexDisabled: ErrNoIndex, pegaderr.UnknownPeer: ErrDenied,
}

// fromStatus turns a gRPC error into one that also matches the typed
// errors above (by its pegaderr reason; by its code from a daemon that
// sends none); nil, and an error it already turned, stay as they are.
func fromStatus(err error) error {
	if err == nil || isTyped(err) {
		return err
	}
	s, ok := status.FromError(err)
	if !ok {
		return err
	}
	if _, r := pegaderr.FromStatus(err); byReason[r] != nil {
		return &statusError{sentinel: byReason[r], err: err}
	}
	var sentinel error
	switch s.Code() {
	case codes.NotFound:
		sentinel = ErrNotFound
	case codes.ResourceExhausted:
		sentinel = ErrPoolFull
	case codes.InvalidArgument:
		sentinel = ErrInvalid
	case codes.Unavailable:
		sentinel = ErrUnavailable
	case codes.Aborted:
		sentinel = ErrAborted
	case codes.Internal:
		sentinel = ErrInternal
	default:
		return err
	}
	return &statusError{sentinel: sentinel, err: err}
}

// isTyped: err is already one of this package's converted errors.
func isTyped(err error) bool {
	var se *statusError
	var so *SocketError
	return errors.As(err, &se) || errors.As(err, &so)
}

// SocketError says that a call found no daemon because one of its sockets
// (the local API socket, or the data socket Dial connects) could not be
// dialled, and why. It matches ErrUnavailable and its cause with errors.Is
// (fs.ErrNotExist: no daemon there; fs.ErrPermission: this user may not
// connect; syscall.ECONNREFUSED: a stale socket file), and a gRPC call's
// error keeps its status (Unavailable).
type SocketError struct {
	Socket string // the socket's path
	Err    error  // the dial's error
	call   error  // the gRPC call's error, if a call failed
}

func (e *SocketError) Error() string {
	return fmt.Sprintf("cannot reach pegad at %s: %s", e.Socket, e.Cause())
}

// Cause is the dial error's own words ("connect: no such file or
// directory"), without the address that Error already names.
func (e *SocketError) Cause() string {
	var op *net.OpError
	if errors.As(e.Err, &op) && op.Err != nil {
		return op.Err.Error()
	}
	return e.Err.Error()
}

func (e *SocketError) Unwrap() []error { return []error{ErrUnavailable, e.Err} }

// GRPCStatus is the failed call's status (Unavailable).
func (e *SocketError) GRPCStatus() *status.Status {
	if e.call == nil {
		return status.New(codes.Unavailable, e.Error())
	}
	return status.Convert(e.call)
}

// statusError matches both its sentinel and the gRPC status.
type statusError struct {
	sentinel error
	err      error
}

func (e *statusError) Error() string              { return e.err.Error() }
func (e *statusError) Unwrap() []error            { return []error{e.sentinel, e.err} }
func (e *statusError) GRPCStatus() *status.Status { return status.Convert(e.err) }
