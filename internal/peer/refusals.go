package peer

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
)

// A peer that refused a certificate (this node's, or this node refused
// its) is not dialled again for a while: gRPC would otherwise redial it in
// the background for as long as the channel lives, and every caller would
// hand it one more handshake to refuse. Get fails at once for that peer
// until its backoff passes or Forget is called (a certificate reload, which
// is also how an operator asks to try again).

// Refusal backoff: the first wait, doubled after each further refusal up to
// the last.
const (
	RefusalBackoff    = 30 * time.Second
	RefusalBackoffMax = 10 * time.Minute
)

// ErrRefusedRecently: Get will not dial a peer that refused a certificate
// within its backoff.
var ErrRefusedRecently = errors.New("peer: not dialled: it refused a certificate")

// RefusedError is Get's error for a peer in its refusal backoff. It wraps
// the refusal it remembers (a peertls.ErrRefused) and ErrRefusedRecently.
type RefusedError struct {
	Peer  string
	Until time.Time // when Get dials the peer again
	Err   error     // the refusal
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("%v; not redialling %s before %s or a certificate reload (SIGHUP)",
		e.Err, e.Peer, e.Until.Format(time.RFC3339))
}

func (e *RefusedError) Unwrap() []error { return []error{ErrRefusedRecently, e.Err} }

// refusal is one peer's backoff state.
type refusal struct {
	err     error
	until   time.Time
	backoff time.Duration // the wait this refusal set
}

// Refused records that peer refused a certificate with err: its channel is
// closed (stopping gRPC's redials) and Get fails for it until the backoff
// passes. A refusal while one is already in force changes nothing (the
// channel's in-flight handshakes all report the same refusal): recorded
// is false then. until is when Get dials peer again. Safe to call from
// gRPC's own goroutines (the client credentials' refusal callback).
func (c *Clients) Refused(peer string, err error) (until time.Time, recorded bool) {
	c.mu.Lock()
	now := c.now()
	r, ok := c.refused[peer]
	if ok && now.Before(r.until) {
		c.mu.Unlock()
		return r.until, false
	}
	backoff := RefusalBackoff
	if ok {
		backoff = min(2*r.backoff, RefusalBackoffMax)
	}
	until = now.Add(backoff)
	c.refused[peer] = refusal{err: err, until: until, backoff: backoff}
	cc := c.conns[peer]
	delete(c.conns, peer)
	c.mu.Unlock()
	if cc != nil {
		c.retire(cc)
	}
	return until, true
}

// refusedCloseDelay is how long a refused peer's channel lives on: the
// calls that saw the refusal fail with it, not with "the client connection
// is closing". gRPC's first redial comes after 1 s (less 20 % jitter).
const refusedCloseDelay = 300 * time.Millisecond

// retire closes cc after refusedCloseDelay (not inline: Refused may run on
// the channel's own connecting goroutine, which Close waits for). Close
// closes it at once if it comes first. c.mu must not be held.
func (c *Clients) retire(cc *grpc.ClientConn) {
	c.mu.Lock()
	c.retired[cc] = struct{}{}
	c.mu.Unlock()
	time.AfterFunc(refusedCloseDelay, func() {
		c.mu.Lock()
		_, ok := c.retired[cc]
		delete(c.retired, cc)
		c.mu.Unlock()
		if ok {
			_ = cc.Close()
		}
	})
}

// Forget drops every remembered refusal: the next Get dials again, with
// the first backoff if refused again. The daemon calls it after reloading
// its certificates.
func (c *Clients) Forget() {
	c.mu.Lock()
	clear(c.refused)
	c.mu.Unlock()
}

// refusedErr is Get's error for peer while its refusal is in force; nil
// otherwise. c.mu must be held.
func (c *Clients) refusedErr(peer string) error {
	r, ok := c.refused[peer]
	if !ok || !c.now().Before(r.until) {
		return nil
	}
	return &RefusedError{Peer: peer, Until: r.until, Err: r.err}
}
