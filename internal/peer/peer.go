// Package peer owns this node's gRPC client connections to other pegads'
// peer ports: one *grpc.ClientConn per peer address, created on first use
// and closed at shutdown. It never retries RPCs on its own; a caller that
// knows a retry is safe can make a channel reconnect now (Reconnect).
//
// Connections use insecure transport credentials unless the dial options
// given to NewClientsWithOptions carry others (peer mTLS: the daemon passes
// the node certificate's credentials, which win as the later option).
// A peer that refused a certificate is not dialled again until its backoff
// passes or the daemon reloads its certificates (Refused, Forget).
package peer

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// errClosed is returned by Get after Close. Unexported: the daemon closes
// its peer clients after every user of them (the requester, the dialer),
// so no caller meets it to branch on.
var errClosed = errors.New("peer: clients closed")

// Clients is safe for concurrent use.
type Clients struct {
	// dialOpts are appended to the defaults for every new connection.
	dialOpts []grpc.DialOption

	mu sync.Mutex // guards conns, refused, retired and closed
	// conns holds one client connection per peer address.
	conns map[string]*grpc.ClientConn
	// refused holds the peers that refused a certificate, retired their
	// channels until they are closed (refusals.go).
	refused map[string]refusal
	retired map[*grpc.ClientConn]struct{}
	closed  bool

	now func() time.Time // the clock of refusal backoffs; tests replace it
}

func NewClients() *Clients { return NewClientsWithOptions() }

// NewClientsWithOptions is NewClients with extra dial options (message size
// limits, interceptors, a test dialer).
func NewClientsWithOptions(opts ...grpc.DialOption) *Clients {
	return &Clients{dialOpts: opts, conns: make(map[string]*grpc.ClientConn), refused: map[string]refusal{},
		retired: map[*grpc.ClientConn]struct{}{}, now: time.Now}
}

// Get returns the client for peer (host:port). It also implements
// Reconnecter. A peer that refused a certificate recently is a
// *RefusedError (refusals.go).
func (c *Clients) Get(peer string) (pegadv1.PeerServiceClient, error) {
	cc, err := c.conn(peer)
	if err != nil {
		return nil, err
	}
	return client{PeerServiceClient: pegadv1.NewPeerServiceClient(cc), cc: cc}, nil
}

// Reconnecter is a peer client whose channel can be told to reconnect now.
type Reconnecter interface {
	// Reconnect makes the channel connect at once, skipping the reconnect
	// backoff an earlier failure left, and waits until it is ready or
	// ctx ends. After a link comes back a channel in backoff otherwise
	// fails every RPC at once with the old dial error ("network is
	// unreachable") for up to its backoff.
	Reconnect(ctx context.Context) error
}

// client is the PeerServiceClient of one channel.
type client struct {
	pegadv1.PeerServiceClient
	cc *grpc.ClientConn
}

func (c client) Reconnect(ctx context.Context) error {
	if c.cc.GetState() == connectivity.Ready {
		return nil // the common case, before every lock query: nothing to reset
	}
	c.cc.ResetConnectBackoff()
	for {
		s := c.cc.GetState()
		switch s {
		case connectivity.Ready:
			return nil
		case connectivity.Shutdown:
			return errClosed
		case connectivity.Idle:
			c.cc.Connect()
		}
		if !c.cc.WaitForStateChange(ctx, s) {
			return fmt.Errorf("peer: channel to %s not ready (%s): %w", c.cc.CanonicalTarget(), s, ctx.Err())
		}
	}
}

func (c *Clients) conn(peer string) (*grpc.ClientConn, error) {
	if peer == "" {
		return nil, fmt.Errorf("peer: empty peer address")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errClosed
	}
	if err := c.refusedErr(peer); err != nil {
		return nil, err
	}
	if cc, ok := c.conns[peer]; ok {
		return cc, nil
	}
	// grpc.NewClient does no I/O (it connects lazily on the first RPC), so
	// creating it under the lock is cheap and makes one conn per peer
	// trivially true.
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, c.dialOpts...)
	cc, err := grpc.NewClient("passthrough:///"+peer, opts...)
	if err != nil {
		return nil, fmt.Errorf("peer: client for %s: %w", peer, err)
	}
	c.conns[peer] = cc
	return cc, nil
}

// Len is the number of cached peer connections.
func (c *Clients) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}

// Close closes every connection; Get fails afterwards. Idempotent.
func (c *Clients) Close() error {
	c.mu.Lock()
	conns, retired := c.conns, c.retired
	c.conns, c.retired = map[string]*grpc.ClientConn{}, map[*grpc.ClientConn]struct{}{}
	c.closed = true
	c.mu.Unlock()
	var errs []error
	for p, cc := range conns {
		if err := cc.Close(); err != nil {
			errs = append(errs, fmt.Errorf("peer: close %s: %w", p, err))
		}
	}
	for cc := range retired {
		_ = cc.Close() // a refused peer's: nothing to report
	}
	return errors.Join(errs...)
}
