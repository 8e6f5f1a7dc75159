package ctl

import (
	"context"

	pegaclient "github.com/pegaflow/pegad/client"
)

// pegactl's calls to the local pegad go through the public client
// (github.com/pegaflow/pegad/client), the package engines use: its own
// methods for blocks (Put, GetTo, Delete, Prefetch), and its Admin, Cluster
// and Local accessors for the rest. Its errors keep their gRPC status, and
// a socket it cannot reach is a pegaclient.SocketError: classify (exit.go)
// turns them into exit codes and the one Error line. Calls to a peer's
// port go through peerClient (peer.go).

// dial opens a client of g.socket. Without blocks it connects the API
// socket only, lazily (a daemon that is not running shows up as a
// SocketError from the first call). With blocks it also connects the data
// socket next to --socket, for zero-copy puts and gets, and falls back to
// gRPC streams where there is none (a socket forwarded from another host,
// an older pegad).
func (g *globalFlags) dial(ctx context.Context, blocks bool) (*pegaclient.Client, error) {
	opt := pegaclient.WithoutDataSocket()
	if blocks {
		opt = pegaclient.AllowStreamFallback()
	}
	return pegaclient.Dial(ctx, g.socket, opt)
}

// withClient runs fn with a client of the API socket and a context bounded
// by --timeout.
func (g *globalFlags) withClient(ctx context.Context, fn func(ctx context.Context, c *pegaclient.Client) error) error {
	return g.withDialled(ctx, false, fn)
}

// withBlockClient is withClient with the data socket too (dial).
func (g *globalFlags) withBlockClient(ctx context.Context, fn func(ctx context.Context, c *pegaclient.Client) error) error {
	return g.withDialled(ctx, true, fn)
}

func (g *globalFlags) withDialled(ctx context.Context, blocks bool, fn func(ctx context.Context, c *pegaclient.Client) error) error {
	ctx, cancel := context.WithTimeout(ctx, g.timeout)
	defer cancel()
	c, err := g.dial(ctx, blocks)
	if err != nil {
		return err
	}
	defer c.Close()
	return fn(ctx, c)
}
