package ctl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/api/pegaderr"
	pegaclient "github.com/pegaflow/pegad/client"
)

// TestClassify: every kind of error a command returns gets the exit code
// docs/pegactl.md ("Errors and exit codes") gives it, and the message
// printed after "Error: ".
func TestClassify(t *testing.T) {
	dialErr := func(errno syscall.Errno) error {
		return &net.OpError{Op: "dial", Net: "unix", Err: os.NewSyscallError("connect", errno)}
	}
	run := func(err error) error { return &runError{err: err} }
	tests := []struct {
		name string
		err  error
		code int
		msg  string // the whole message, or its start when it ends in "..."
	}{
		{"cobra's own error", errors.New(`unknown flag: --x`), ExitUsage, "unknown flag: --x"},
		{"usage", run(usageErrorf("--namespace is required")), ExitUsage, "--namespace is required"},
		{"chosen not found", run(notFoundErrorf("none of the 2 blocks is on h:1")), ExitNotFound, "none of the 2 blocks is on h:1"},
		{"no daemon", run(&pegaclient.SocketError{Socket: "/s.sock", Err: dialErr(syscall.ENOENT)}), ExitUnavailable,
			"cannot reach pegad at /s.sock: connect: no such file or directory (is pegad running? set --socket or PEGACTL_SOCKET)"},
		{"stale socket", run(fmt.Errorf("reconnect: %w", &pegaclient.SocketError{Socket: "/s.sock", Err: dialErr(syscall.ECONNREFUSED)})),
			ExitUnavailable, "cannot reach pegad at /s.sock: connect: connection refused ..."},
		{"no access to the socket", run(&pegaclient.SocketError{Socket: "/nonexistent/s.sock", Err: dialErr(syscall.EACCES)}),
			ExitPermission, "permission denied on pegad's socket /nonexistent/s.sock: ..."},
		{"data socket: not found", run(fmt.Errorf("lease: %w", pegaclient.ErrNotFound)), ExitNotFound, "lease: pegad: block not found"},
		{"data socket: invalid", run(fmt.Errorf("put: %w: hash of 65 bytes", pegaclient.ErrInvalid)), ExitUsage, "put: pegad: invalid request: hash of 65 bytes"},
		{"data socket: unavailable", run(fmt.Errorf("put: %w", pegaclient.ErrUnavailable)), ExitUnavailable, "put: pegad: daemon unavailable"},
		{"data socket: pool full", run(fmt.Errorf("put: %w", pegaclient.ErrPoolFull)), ExitError, "put: pegad: pool full"},
		{"deadline", run(fmt.Errorf("stats: %w", context.DeadlineExceeded)), ExitError, "timed out (raise --timeout)"},
		{"NotFound", run(status.Error(codes.NotFound, "block not found: namespace=n hash=ab")), ExitNotFound, "block not found: namespace=n hash=ab"},
		{"InvalidArgument", run(status.Error(codes.InvalidArgument, "hash of 65 bytes")), ExitUsage, "hash of 65 bytes"},
		{"Unavailable", run(status.Error(codes.Unavailable, "peer h:1: connection broken")), ExitUnavailable, "peer h:1: connection broken"},
		{"PermissionDenied", run(status.Error(codes.PermissionDenied, "holder refused the certificate")), ExitPermission, "holder refused the certificate"},
		{"Unauthenticated", run(status.Error(codes.Unauthenticated, "no certificate")), ExitPermission, "no certificate"},
		{"DeadlineExceeded status", run(status.Error(codes.DeadlineExceeded, "transfer deadline")), ExitError, "timed out: transfer deadline (raise --timeout)"},
		{"Unimplemented", run(status.Error(codes.Unimplemented, "ListNodes")), ExitError, "pegad does not implement this: ListNodes"},
		{"ResourceExhausted", run(status.Error(codes.ResourceExhausted, "pool full")), ExitError, "pool full"},
		{"typed status keeps its code", run(fmt.Errorf("put: %w", pegaderr.Status(codes.NotFound, pegaderr.NotFound, "block not found").Err())),
			ExitNotFound, "block not found"},
		{"gRPC wrapping dropped", run(status.Error(codes.Unavailable, "fetch: rpc error: code = Unavailable desc = holder draining")),
			ExitUnavailable, "fetch: holder draining"},
		{"transport wrapping dropped", run(status.Error(codes.Unavailable, `connection error: desc = "transport: tls: bad certificate"`)),
			ExitUnavailable, "tls: bad certificate"},
		{"anything else", run(errors.New("segment file: shrank")), ExitError, "segment file: shrank"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, msg := classify(tc.err)
			ok := msg == tc.msg
			if prefix, cut := strings.CutSuffix(tc.msg, "..."); cut {
				ok = strings.HasPrefix(msg, prefix)
			}
			if code != tc.code || !ok {
				t.Errorf("classify(%v) = %d %q, want %d %q", tc.err, code, msg, tc.code, tc.msg)
			}
		})
	}
}

// TestClassifyClientErrors: the public client's own errors, through the
// client as pegactl uses it, classify as the docs say.
func TestClassifyClientErrors(t *testing.T) {
	sock := shortSocket(t)
	c, err := pegaclient.Dial(context.Background(), sock, pegaclient.WithoutDataSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	err = c.Delete(context.Background(), "ns", []byte{1})
	code, msg := classify(&runError{err: err})
	if want := "cannot reach pegad at " + sock + ": connect: no such file or directory (is pegad running? set --socket or PEGACTL_SOCKET)"; code != ExitUnavailable || msg != want {
		t.Fatalf("Delete without a daemon: %d %q, want %d %q", code, msg, ExitUnavailable, want)
	}
}

// shortSocket is a socket path under a short directory (unix socket
// paths are limited to 108 bytes), with nothing listening.
func shortSocket(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pegactl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir + "/absent.sock"
}
