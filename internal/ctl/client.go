package ctl

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// maxRecvMsg bounds one message from pegad: data chunks are at most 1 MiB,
// list answers can be larger.
const maxRecvMsg = 64 << 20

// client is one connection to pegad's unix socket.
type client struct {
	conn   *grpc.ClientConn
	local  pegadv1.LocalServiceClient
	admin  pegadv1.AdminServiceClient
	socket string

	mu      sync.Mutex // guards dialErr
	dialErr error      // last failure to connect the socket, for a readable error
}

// dial prepares a client for g.socket. gRPC connects lazily: a daemon that
// is not running shows up as an unavailableError from the first RPC.
func (g *globalFlags) dial() (*client, error) {
	c := &client{socket: g.socket}
	conn, err := grpc.NewClient("passthrough:///pegad",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(c.dialUnix),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvMsg)),
		grpc.WithUnaryInterceptor(c.unaryInterceptor),
		grpc.WithStreamInterceptor(c.streamInterceptor),
	)
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", g.socket, err)
	}
	c.conn = conn
	c.local = pegadv1.NewLocalServiceClient(conn)
	c.admin = pegadv1.NewAdminServiceClient(conn)
	return c, nil
}

func (c *client) Close() error { return c.conn.Close() }

func (c *client) dialUnix(ctx context.Context, _ string) (net.Conn, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", c.socket)
	c.mu.Lock()
	c.dialErr = err
	c.mu.Unlock()
	return conn, err
}

// unavailable turns a failure to reach the socket into unavailableError,
// whose message names the socket and the cause ("no such file or
// directory", "connection refused") rather than gRPC's transport text.
func (c *client) unavailable(err error) error {
	if status.Code(err) != codes.Unavailable {
		return err
	}
	c.mu.Lock()
	dialErr := c.dialErr
	c.mu.Unlock()
	if dialErr == nil {
		return err
	}
	if errors.Is(dialErr, fs.ErrPermission) {
		return &permissionError{socket: c.socket, group: socketGroup(c.socket)}
	}
	cause := dialErr.Error()
	var opErr *net.OpError
	if errors.As(dialErr, &opErr) && opErr.Err != nil {
		cause = opErr.Err.Error()
	}
	return &unavailableError{socket: c.socket, cause: cause}
}

func (c *client) unaryInterceptor(ctx context.Context, method string, req, reply any,
	cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	return c.unavailable(invoker(ctx, method, req, reply, cc, opts...))
}

func (c *client) streamInterceptor(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn,
	method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := streamer(ctx, desc, cc, method, opts...)
	if err != nil {
		return nil, c.unavailable(err)
	}
	return s, nil
}

// withClient runs fn with a client and a context bounded by --timeout.
func (g *globalFlags) withClient(ctx context.Context, fn func(ctx context.Context, c *client) error) error {
	c, err := g.dial()
	if err != nil {
		return err
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	return fn(ctx, c)
}
