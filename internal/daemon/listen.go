package daemon

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/pegaflow/pegad/internal/localdata"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// SocketMode is the local socket's permission: owner and group (operators
// in pegad's group) may connect, nobody else.
const SocketMode = 0o660

// maxSocketPath is the longest path bind(2) takes for a unix socket
// (sun_path's 108 bytes, less the terminating NUL).
const maxSocketPath = 107

// ErrSocketInUse: another process listens on the socket path.
var ErrSocketInUse = errors.New("socket in use by a running process")

// listenUnix listens on path, creating its directory (0750) when missing.
// A leftover socket file is removed only when nothing answers on it; any
// other kind of file there is left alone and is an error.
func listenUnix(path string) (net.Listener, error) {
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("socket %s: %d bytes, longer than the %d a unix socket path may have: choose a shorter --socket",
			path, len(path), maxSocketPath)
	}
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

// boundListeners are pegad's ports, bound first thing in Start, before the
// pool is populated (seconds for a large pool), so that "address already in
// use" or a socket held by another pegad fails start-up at once. listen
// hands each to its server; those never handed over are closed on a
// failed start.
type boundListeners struct {
	peer, local, data, metrics, debug net.Listener
}

// bind binds the peer port, the local socket, its data socket, the
// metrics port and, when asked, the debug port.
func (d *Daemon) bind() error {
	cfg := &d.cfg
	l, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("--listen: %w", err) // err names the address
	}
	d.bound.peer = l
	d.peerAddr = boundAddr(cfg.Listen, l.Addr())
	d.advertise = cfg.Advertise
	if d.advertise == "" {
		d.advertise = d.peerAddr
	}
	// A relative --socket is resolved once, here, against the working
	// directory: gRPC's unix:// target takes only absolute paths (it read
	// "run/a.sock" as authority "run"), and every later use (self-check,
	// data socket, logs) then names the same file.
	if cfg.Socket, err = filepath.Abs(cfg.Socket); err != nil {
		return fmt.Errorf("--socket: %w", err)
	}
	if d.bound.local, err = listenUnix(cfg.Socket); err != nil {
		return err
	}
	if d.bound.data, err = listenUnix(localdata.SocketPath(cfg.Socket)); err != nil {
		return err
	}
	for _, p := range []string{cfg.Socket, localdata.SocketPath(cfg.Socket)} {
		if err := chownSocket(p, cfg.SocketGroup); err != nil {
			return err
		}
	}
	if cfg.MetricsListen != "" {
		ml, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("--metrics-listen: %w", err)
		}
		d.bound.metrics = ml
		d.metricsAddr = boundAddr(cfg.MetricsListen, ml.Addr())
	}
	if cfg.DebugListen != "" {
		dl, err := net.Listen("tcp", cfg.DebugListen)
		if err != nil {
			return fmt.Errorf("--debug-listen: %w", err)
		}
		d.bound.debug = dl
		d.debugAddr = boundAddr(cfg.DebugListen, dl.Addr())
	}
	return nil
}

// closeUnserved closes the listeners no server took over.
func (b *boundListeners) closeUnserved() {
	for _, l := range []*net.Listener{&b.peer, &b.local, &b.data, &b.metrics, &b.debug} {
		if *l != nil {
			_ = (*l).Close()
			*l = nil
		}
	}
}

// take hands *l to its server: Close of the server closes it from then on.
func take(l *net.Listener) net.Listener {
	t := *l
	*l = nil
	return t
}

// boundAddr is the address to log and advertise for a listener bound on
// configured: Go reports a wildcard IPv4 listener as "[::]:port" (it
// listens dual-stack), which is not what the operator wrote; keep the
// configured host and take the port actually bound.
func boundAddr(configured string, a net.Addr) string {
	host, _, err := net.SplitHostPort(configured)
	ta, ok := a.(*net.TCPAddr)
	if err != nil || !ok {
		return a.String()
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return net.JoinHostPort(host, strconv.Itoa(ta.Port))
}
