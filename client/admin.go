package client

import (
	"context"
	"sync"

	"google.golang.org/grpc"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// The daemon's gRPC services, for the calls the Client has no method of
// its own for: an operator's tool (pegactl) reads stats, sessions and
// connections through them, over the Client's one connection. Errors come
// back as the Client's own calls' do: they match the typed errors
// (ErrNotFound, ErrUnavailable, ...) with errors.Is, keep their gRPC
// status (status.Code works on them), and a daemon that cannot be reached
// is a SocketError. Errors of a stream's Send and Recv (Local().GetBlock)
// are gRPC's own: use Get and Put for blocks.

// Admin is the daemon's AdminService: transfer sessions and locks, peer
// connections, stats, version.
func (c *Client) Admin() pegadv1.AdminServiceClient { return pegadv1.NewAdminServiceClient(c.typed) }

// Cluster is the daemon's ClusterService: the cluster index's nodes and
// which of them hold a block (pegad --cluster-redis).
func (c *Client) Cluster() pegadv1.ClusterServiceClient {
	return pegadv1.NewClusterServiceClient(c.typed)
}

// Local is the daemon's LocalService, for ListBlocks; the Client's own
// methods are the way to put, get, delete and prefetch.
func (c *Client) Local() pegadv1.LocalServiceClient { return pegadv1.NewLocalServiceClient(c.typed) }

// typedConn is the Client's gRPC channel with every call's error turned
// into the Client's typed errors (grpcErr).
type typedConn struct {
	cc grpc.ClientConnInterface
	c  *Client
}

func (t typedConn) Invoke(ctx context.Context, method string, args, reply any, opts ...grpc.CallOption) error {
	return t.c.grpcErr(t.cc.Invoke(ctx, method, args, reply, opts...))
}

func (t typedConn) NewStream(ctx context.Context, desc *grpc.StreamDesc, method string, opts ...grpc.CallOption) (grpc.ClientStream, error) {
	s, err := t.cc.NewStream(ctx, desc, method, opts...)
	if err != nil {
		return nil, t.c.grpcErr(err)
	}
	return s, nil
}

// dialRecord is the outcome of the last dial of the local API socket,
// which says why a call found no daemon ("no such file or directory",
// "permission denied") where gRPC's status says only Unavailable.
type dialRecord struct {
	mu  sync.Mutex // guards err
	err error      // nil after a dial that connected
}

func (r *dialRecord) set(err error) {
	r.mu.Lock()
	r.err = err
	r.mu.Unlock()
}

func (r *dialRecord) get() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}
