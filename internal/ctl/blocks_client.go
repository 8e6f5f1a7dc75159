package ctl

import (
	"context"
	"errors"

	"google.golang.org/grpc/status"

	pegaclient "github.com/pegaflow/pegad/client"
)

// withBlockClient runs fn with the public client (github.com/pegaflow/pegad/client)
// over pegactl's connection: zero-copy through the data socket next to
// --socket when it is there, gRPC streams otherwise (a socket forwarded
// from another host, an older pegad). Errors come back with pegactl's exit
// codes.
func (g *globalFlags) withBlockClient(ctx context.Context, fn func(ctx context.Context, c *pegaclient.Client) error) error {
	return g.withClient(ctx, func(ctx context.Context, c *client) error {
		bc, err := pegaclient.Dial(ctx, c.socket, pegaclient.WithConn(c.conn), pegaclient.AllowStreamFallback())
		if err != nil {
			return exitOf(err)
		}
		defer bc.Close()
		return exitOf(fn(ctx, bc))
	})
}

// exitOf gives the client's typed errors from the data socket the exit
// codes their gRPC equivalents get (those keep their status and are
// classified from it).
func exitOf(err error) error {
	var se interface{ GRPCStatus() *status.Status }
	if err == nil || errors.As(err, &se) {
		return err
	}
	switch {
	case errors.Is(err, pegaclient.ErrNotFound):
		return notFoundErrorf("%v", err)
	case errors.Is(err, pegaclient.ErrInvalid):
		return usageErrorf("%v", err)
	case errors.Is(err, pegaclient.ErrUnavailable):
		return &exitError{code: ExitUnavailable, err: err}
	}
	return err
}
