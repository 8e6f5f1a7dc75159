package conn

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sync/singleflight"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/metrics"
)

// PeerDialer returns a peer-service client for a peer address.
type PeerDialer func(peer string) (pegadv1.PeerServiceClient, error)

// DialerOptions configure a Dialer.
type DialerOptions struct {
	// Advertise is this node's advertised peer address, sent in handshakes
	// so that holders can name it (conns list); informational.
	Advertise  string
	QPsPerPeer int
	Dial       PeerDialer
	// HandshakeTimeout bounds one handshake (default 10s).
	HandshakeTimeout time.Duration
	// DisconnectTimeout bounds one best-effort RdmaDisconnect sent to a
	// holder when a connection to it is torn down (default 2s); Close
	// waits at most about this long for them.
	DisconnectTimeout time.Duration
	// ProbeInterval: a connection no Read has used for this long gets one
	// small keepalive READ per NIC, and again every interval while idle. A
	// dead holder fails it within the QP's retry budget
	// (NICOptions.ConnectAttr), which invalidates the connection: it stops
	// being listed as connected. 0: no keepalive (a dead holder is then
	// noticed by the next fetch). It needs NICOptions.Keepalive.
	ProbeInterval time.Duration
	// SliceBytes splits a READ larger than it into slices, each placed on
	// its own NIC and QP (as Mooncake slices a transfer), so that one
	// large segment does not ride one NIC (default 1 MiB: large enough for
	// line rate per WR, small enough that an 8 MiB segment spreads over 8).
	SliceBytes uint64
}

// Dialer is the requester side: one AddrConnection per peer address,
// made by a handshake it dials (handshake.go), each owning its QPs (one CQ
// per QP) and one session worker goroutine per QP (worker.go); the
// keepalive prober (probe.go); and the rails' effect on its connections
// (rail.go). Workers stop when their connection is invalidated (its done
// channel closes); QPs and CQs are destroyed once the last in-flight Read
// has returned; then a best-effort RdmaDisconnect goroutine (tracked,
// bounded by DisconnectTimeout) tells the holder to free its side. The
// prober is started by NewDialer and stopped by Close.
//
// It never accepts: it serves no handshake and binds no window; the
// Acceptor does. Safe for concurrent use.
type Dialer struct {
	nics *NICs
	opts DialerOptions
	log  zerolog.Logger
	met  *metrics.Metrics // nics.met
	// ctx is canceled by Close; handshakes run under it, not under a
	// caller's context, because singleflight shares them between callers.
	ctx    context.Context
	cancel context.CancelFunc

	sf singleflight.Group

	// mu guards peers, connecting and closed. It is never held across an
	// RPC, a verbs call that may block, or a wait for another goroutine,
	// nor while NICs.mu is taken.
	mu    sync.Mutex
	peers map[string]*AddrConnection // by peer address
	// connecting: handshakes in flight, by peer address; informational
	// only (List), singleflight does the deduplication.
	connecting map[string]time.Time
	closed     bool

	handshake sync.WaitGroup // running handshakes
	conns     sync.WaitGroup // connections not yet torn down
	workers   sync.WaitGroup // session worker goroutines
	// disconnects: RdmaDisconnect goroutines (goDisconnect). Adds happen
	// only in connect (under handshake) and in teardown (under conns), so
	// Close, which waits for those first, waits for every one.
	disconnects sync.WaitGroup
	probing     sync.WaitGroup // the prober goroutine
	closeOnce   sync.Once

	// probeTimeout: an unanswered keepalive READ fails after this long,
	// in nanoseconds (the retry budget + probeSlack; atomic so that tests
	// can change it while the prober runs).
	probeTimeout atomic.Int64

	// Test hooks (nil in production), set by the package's tests before
	// the dialer is used.
	hookBeforeRPC func(peer string)
	// hookInvalidated runs in AddrConnection.invalidate right after the
	// connection is marked invalid (c.mu released).
	hookInvalidated func(c *AddrConnection)
	// hookAbort runs in Read's abort, after queued batches were canceled
	// and before running ones are told to stop.
	hookAbort func(batches []*batch)
}

// NewDialer returns the requester side over nics, with no connections
// (at most one Dialer per NIC set). Close it before nics.
func NewDialer(nics *NICs, opts DialerOptions) (*Dialer, error) {
	if nics == nil {
		return nil, errors.New("conn: NewDialer: no NICs")
	}
	if opts.Dial == nil {
		return nil, errors.New("conn: DialerOptions.Dial is required")
	}
	if opts.QPsPerPeer <= 0 {
		opts.QPsPerPeer = 1
	}
	if opts.QPsPerPeer > maxQPsPerPeer {
		return nil, fmt.Errorf("conn: qps per peer %d exceeds %d", opts.QPsPerPeer, maxQPsPerPeer)
	}
	if opts.ProbeInterval > 0 && nics.probeMem == nil {
		return nil, errors.New("conn: DialerOptions.ProbeInterval needs NICOptions.Keepalive")
	}
	if opts.SliceBytes == 0 {
		opts.SliceBytes = defaultSliceBytes
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = defaultHandshakeTimeout
	}
	if opts.DisconnectTimeout <= 0 {
		opts.DisconnectTimeout = defaultDisconnectTimeout
	}
	d := &Dialer{
		nics:       nics,
		opts:       opts,
		log:        nics.log,
		met:        nics.met,
		peers:      make(map[string]*AddrConnection),
		connecting: make(map[string]time.Time),
	}
	d.probeTimeout.Store(int64(nics.opts.ConnectAttr.RetryBudget() + probeSlack))
	if !nics.dialer.CompareAndSwap(nil, d) {
		return nil, errors.New("conn: the NICs already have a Dialer")
	}
	d.ctx, d.cancel = context.WithCancel(context.Background())
	if opts.ProbeInterval > 0 {
		d.probing.Add(1)
		go d.prober()
	}
	return d, nil
}

// Get returns a connected AddrConnection to peer, handshaking if needed
// (at most one handshake per peer in flight; concurrent callers wait).
func (d *Dialer) Get(ctx context.Context, peer string) (*AddrConnection, error) {
	if c, err := d.lookup(peer); c != nil || err != nil {
		return c, err
	}
	ch := d.sf.DoChan(peer, func() (any, error) {
		// Re-check: a handshake that finished between lookup and DoChan
		// already published its connection.
		if c, err := d.lookup(peer); c != nil || err != nil {
			return c, err
		}
		return d.connect(peer)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.(*AddrConnection), nil
	case <-ctx.Done():
		// The handshake goes on (bounded by HandshakeTimeout) for the
		// other callers; its result is published for the next Get.
		return nil, ctx.Err()
	}
}

func (d *Dialer) lookup(peer string) (*AddrConnection, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	return d.peers[peer], nil
}

// Invalidate removes c (if it is still the current connection to its peer)
// and tears it down once in-flight work is done.
func (d *Dialer) Invalidate(c *AddrConnection, reason error) {
	if c == nil {
		return
	}
	d.mu.Lock()
	if d.peers[c.peer] == c {
		delete(d.peers, c.peer)
	}
	d.mu.Unlock()
	c.invalidate(reason)
}

// List returns the live connections and the handshakes in flight (state
// connecting, listed first). Connections that were invalidated and still
// drain in-flight work are not listed.
func (d *Dialer) List() []ConnInfo {
	d.mu.Lock()
	var out []ConnInfo
	for peer, since := range d.connecting {
		out = append(out, ConnInfo{Peer: peer, Role: RoleRequester, State: StateConnecting, Since: since})
	}
	peers := make([]*AddrConnection, 0, len(d.peers))
	for _, c := range d.peers {
		peers = append(peers, c)
	}
	d.mu.Unlock()
	for _, c := range peers {
		out = append(out, c.info())
	}
	return out
}

// requesterConns snapshots the live connections; none for a nil Dialer
// (a NIC set without one).
func (d *Dialer) requesterConns() []*AddrConnection {
	if d == nil {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*AddrConnection, 0, len(d.peers))
	for _, c := range d.peers {
		out = append(out, c)
	}
	return out
}

// Close invalidates every connection and waits for their workers and
// disconnects. In-flight Reads are aborted (their QPs moved to ERROR and
// drained).
func (d *Dialer) Close() error {
	d.closeOnce.Do(func() {
		d.mu.Lock()
		d.closed = true
		peers := d.peers
		d.peers = make(map[string]*AddrConnection)
		d.mu.Unlock()
		d.cancel()       // aborts running handshakes, stops the prober
		d.probing.Wait() // the prober may be reading through a connection

		for _, c := range peers {
			c.invalidate(ErrClosed)
			c.abortInFlight()
		}
		d.handshake.Wait()
		d.conns.Wait()
		d.workers.Wait()
		d.disconnects.Wait() // each bounded by DisconnectTimeout
		d.nics.dialer.CompareAndSwap(d, nil)
	})
	return nil
}

// begin counts one handshake in d.handshake, which Close waits for
// (before the NICs release the PDs it uses); ErrClosed once d is closed.
func (d *Dialer) begin() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	d.handshake.Add(1) // under mu: Close sets closed before it Waits
	return nil
}

// goDisconnect tells peer, from a goroutine the dialer waits for at
// Close, that the connection of handshake hsID is abandoned, so the holder
// frees its QPs now. Best effort and bounded by DisconnectTimeout: the
// holder may well be dead (that is often why the connection was
// invalidated), so a failure is only logged at debug. It never blocks its
// caller. Its context is not d.ctx: Close cancels that first, and the
// disconnects of Close's own teardowns must still go out.
func (d *Dialer) goDisconnect(client pegadv1.PeerServiceClient, peer, hsID string, log zerolog.Logger) {
	if client == nil || hsID == "" {
		return
	}
	d.disconnects.Add(1)
	go func() {
		defer d.disconnects.Done()
		ctx, cancel := context.WithTimeout(context.Background(), d.opts.DisconnectTimeout)
		defer cancel()
		resp, err := client.RdmaDisconnect(ctx, &pegadv1.RdmaDisconnectRequest{
			Requester:   &pegadv1.Requester{NodeId: d.nics.opts.NodeID, Incarnation: d.nics.opts.Incarnation},
			HandshakeId: hsID,
		})
		if err != nil {
			log.Debug().Err(err).Str("peer", peer).Msg("rdma disconnect not delivered")
			return
		}
		log.Debug().Str("peer", peer).Uint32("qps_released", resp.GetQpsReleased()).Msg("rdma disconnect delivered")
	}()
}

// tick runs f every interval until ctx ends; the body of the halves'
// background goroutines (the prober, the reaper), whose owner counts them.
func tick(ctx context.Context, every time.Duration, f func(now time.Time)) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			f(now)
		}
	}
}
