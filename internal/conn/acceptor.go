package conn

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/logging"
	"github.com/pegaflow/pegad/internal/metrics"
)

// AcceptorOptions configure an Acceptor.
type AcceptorOptions struct {
	// IdleTimeout: an accepted connection whose data connections (once
	// opened) have all been closed for this long is torn down, its
	// requester being gone (default 60s). Only providers that see their
	// data connections (tcp) report that; see activityReporter. Others
	// (verbs) are torn down once their requester has held no transfer
	// session for this long (SetRequesterActivity).
	IdleTimeout time.Duration
	// ReconnectDrain bounds how long the previous accepted connection of a
	// requester that handshook again keeps serving the READs in flight on
	// it (default 30s); its requester's disconnect usually ends it sooner.
	ReconnectDrain time.Duration
}

// Acceptor is the holder side: one accepted connection per requester
// node, made by the accept half of the handshake (accept.go), and the
// retired generations of a requester that reconnected (reap.go); the
// reaper that tears down those whose requester is gone; and the memory
// windows bound over a lock's blocks on them (windows.go, quarantine.go).
// An accepted connection owns its QPs (on the NIC's shared holder CQ) and
// runs no goroutine: a holder posts nothing but window binds, READs being
// one-sided. The reaper is started by NewAcceptor and stopped by Close.
//
// It never dials: it makes no handshake and posts no READ; the Dialer
// does. Safe for concurrent use.
type Acceptor struct {
	nics *NICs
	opts AcceptorOptions
	log  zerolog.Logger
	met  *metrics.Metrics // nics.met
	// invalidLog limits "rejected malformed rdma handshake" lines (anyone
	// who reaches the peer port can send them); every one is still
	// counted in pegaflow_rdma_handshakes_total{result="invalid"}.
	invalidLog *logging.Limiter
	// ctx is canceled by Close: the reaper stops with it.
	ctx    context.Context
	cancel context.CancelFunc

	// mu guards accepted, retired and closed. It is never held across an
	// RPC, a verbs call that may block, or a wait for another goroutine,
	// nor while NICs.mu is taken.
	mu       sync.Mutex
	accepted map[string]*acceptedConn // by requester node_id
	// retired: generations replaced by a reconnect of the same requester
	// process, draining, with the time they were retired.
	retired map[*acceptedConn]time.Time
	closed  bool
	// activity: the holder's requester sessions (SetRequesterActivity),
	// by which the reaper judges QPs that do not report activity.
	activity atomic.Pointer[RequesterActivity]
	// windowTurn rotates the QPs that windows are bound on.
	windowTurn atomic.Uint64

	accepts   sync.WaitGroup // running Accepts, Disconnects and binds
	reaping   sync.WaitGroup // the reaper goroutine
	closeOnce sync.Once

	// hookAccept (tests; nil in production) runs at the start of Accept.
	hookAccept func(req *pegadv1.RdmaHandshakeRequest)
}

// NewAcceptor returns the holder side over nics, with no connections (at
// most one Acceptor per NIC set). Close it before nics.
func NewAcceptor(nics *NICs, opts AcceptorOptions) (*Acceptor, error) {
	if nics == nil {
		return nil, errors.New("conn: NewAcceptor: no NICs")
	}
	if opts.IdleTimeout <= 0 {
		opts.IdleTimeout = defaultIdleTimeout
	}
	if opts.ReconnectDrain <= 0 {
		opts.ReconnectDrain = defaultReconnectDrain
	}
	acc := &Acceptor{
		nics:       nics,
		opts:       opts,
		log:        nics.log,
		met:        nics.met,
		invalidLog: logging.NewLimiter(invalidLogEvery),
		accepted:   make(map[string]*acceptedConn),
		retired:    make(map[*acceptedConn]time.Time),
	}
	if !nics.acceptor.CompareAndSwap(nil, acc) {
		return nil, errors.New("conn: the NICs already have an Acceptor")
	}
	acc.ctx, acc.cancel = context.WithCancel(context.Background())
	acc.reaping.Add(1)
	go acc.reaper()
	return acc, nil
}

// WindowsEnabled reports whether locks are served through memory windows
// (NICs.WindowsEnabled).
func (acc *Acceptor) WindowsEnabled() bool { return acc.nics.windows }

// List returns the accepted connections, then the generations draining
// after a reconnect (as invalidated).
func (acc *Acceptor) List() []ConnInfo {
	acc.mu.Lock()
	live := make([]*acceptedConn, 0, len(acc.accepted))
	for _, a := range acc.accepted {
		live = append(live, a)
	}
	retired := make([]*acceptedConn, 0, len(acc.retired))
	for a := range acc.retired {
		retired = append(retired, a)
	}
	acc.mu.Unlock()
	var out []ConnInfo
	for _, a := range live {
		out = append(out, a.info())
	}
	for _, a := range retired {
		ci := a.info()
		ci.State = StateInvalidated // draining after a reconnect
		out = append(out, ci)
	}
	return out
}

// Close destroys every accepted connection and waits for the Accepts,
// Disconnects and binds in flight.
func (acc *Acceptor) Close() error {
	acc.closeOnce.Do(func() {
		acc.mu.Lock()
		acc.closed = true
		live := acc.accepted
		retired := acc.retired
		acc.accepted = make(map[string]*acceptedConn)
		acc.retired = make(map[*acceptedConn]time.Time)
		acc.mu.Unlock()
		acc.cancel()       // stops the reaper
		acc.reaping.Wait() // the reaper may be destroying what it reaped
		for _, a := range live {
			a.destroy("shutdown")
		}
		for a := range retired {
			a.destroy("shutdown")
		}
		acc.accepts.Wait()
		acc.nics.acceptor.CompareAndSwap(acc, nil)
	})
	return nil
}

// begin counts one Accept or bind in acc.accepts, which Close waits for
// (before the NICs release the PDs it uses); ErrClosed once acc is closed.
func (acc *Acceptor) begin() error {
	acc.mu.Lock()
	defer acc.mu.Unlock()
	if acc.closed {
		return ErrClosed
	}
	acc.accepts.Add(1) // under mu: Close sets closed before it Waits
	return nil
}

// Listing is what `pegactl conns list` shows of one node: the rows of
// both halves (the Dialer's first) and the QPs of their NIC set. Either
// half may be nil. It only reads.
type Listing struct {
	Dialer   *Dialer
	Acceptor *Acceptor
}

// List is the Dialer's rows, then the Acceptor's.
func (l Listing) List() []ConnInfo {
	var out []ConnInfo
	if l.Dialer != nil {
		out = append(out, l.Dialer.List()...)
	}
	if l.Acceptor != nil {
		out = append(out, l.Acceptor.List()...)
	}
	return out
}

// QPs is the live QPs of the halves' NIC set (NICs.QPs).
func (l Listing) QPs() int {
	switch {
	case l.Dialer != nil:
		return l.Dialer.nics.QPs()
	case l.Acceptor != nil:
		return l.Acceptor.nics.QPs()
	}
	return 0
}
