package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// SocketMode is the local socket's permission: owner and group (operators
// in pegad's group) may connect, nobody else.
const SocketMode = 0o660

// ErrSocketInUse: another process listens on the socket path.
var ErrSocketInUse = errors.New("socket in use by a running process")

// listenUnix listens on path, creating its directory (0750) when missing.
// A leftover socket file is removed only when nothing answers on it; any
// other kind of file there is left alone and is an error.
func listenUnix(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, fmt.Errorf("socket directory: %w", err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("socket %s: exists and is not a socket (%s); not removing it", path, fi.Mode().Type())
		}
		c, err := net.DialTimeout("unix", path, 500*time.Millisecond)
		if err == nil {
			c.Close()
			return nil, fmt.Errorf("socket %s: %w (another pegad?)", path, ErrSocketInUse)
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("remove stale socket %s: %w", path, err)
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", path, err)
	}
	// The default umask leaves the socket 0755 (no one else may connect);
	// widen it to the group only.
	if err := os.Chmod(path, SocketMode); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod socket %s: %w", path, err)
	}
	return l, nil
}

// streamRecovery turns a panic in a streaming handler into codes.Internal,
// as holder.RecoveryInterceptor does for unary ones.
func streamRecovery(log zerolog.Logger) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		defer func() {
			if r := recover(); r != nil {
				log.Error().Str("method", info.FullMethod).Interface("panic", r).Bytes("stack", debug.Stack()).
					Msg("gRPC stream handler panicked")
				err = status.Errorf(codes.Internal, "internal error in %s", info.FullMethod)
			}
		}()
		return handler(srv, ss)
	}
}
