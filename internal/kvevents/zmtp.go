package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/netgate"
)

// The ZeroMQ side: the sockets, over zmtpconn.go's ZMTP codec (pure Go,
// so CGO_ENABLED=0 builds keep the publisher). Unlike a ZeroMQ PUB socket,
// which sends to every subscriber in turn from one queue (one subscriber
// that stops reading stalls the others) and drops past its high-water
// mark without saying so, every subscriber here has its own bounded queue
// and writer goroutine, and what a full queue drops is counted.

type serverKind int

const (
	kindPub    serverKind = iota // PUB: subscribers
	kindReplay                   // ROUTER: vLLM's replay protocol
)

// listen binds a tcp:// or ipc:// endpoint ("*" is every address).
func listen(endpoint string, kind serverKind, p *Publisher) (*server, error) {
	network, addr, ok := strings.Cut(endpoint, "://")
	switch {
	case !ok:
		return nil, fmt.Errorf("%q: want tcp://HOST:PORT or ipc://PATH", endpoint)
	case network == "tcp":
		addr = strings.Replace(addr, "*", "", 1)
	case network == "ipc":
		network = "unix"
	default:
		return nil, fmt.Errorf("%q: only tcp:// and ipc:// endpoints are served", endpoint)
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return nil, err
	}
	return newServer(kind, ln, p), nil
}

func newServer(kind serverKind, ln net.Listener, p *Publisher) *server {
	return &server{kind: kind, ln: ln, p: p, conns: map[*peer]struct{}{},
		half: netgate.New[net.Conn](netgate.DefaultMaxHalfOpen, netgate.DefaultMaxHalfOpenPerSource)}
}

// server accepts ZMTP connections on one endpoint. Lock order: server.mu,
// then a peer's mu (fanOut, subscribed); neither is held across network
// I/O.
type server struct {
	kind serverKind
	ln   net.Listener
	p    *Publisher
	// half bounds the connections in their handshake: each holds a
	// goroutine, a file and two 4 KiB buffers until handshakeTimeout, and
	// anyone who reaches the port can open them. A newer one evicts the
	// oldest of its source (64), else of all (512): a flood cannot lock a
	// router out, only make it reconnect (ZeroMQ does by itself).
	half *netgate.Gate[net.Conn]

	mu     sync.Mutex // guards conns and closed
	conns  map[*peer]struct{}
	closed bool
}

// peer is one connection: a subscriber (topics, out) or a replay client.
type peer struct {
	c   *zmtpConn
	out chan message // PUB only: bounded, filled by fanOut

	mu     sync.Mutex // guards topics
	topics []string
}

func (s *server) close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	for pe := range s.conns {
		_ = pe.c.Close()
	}
	s.mu.Unlock()
	_ = s.ln.Close()
}

// handshakeTimeout bounds a connection's ZMTP greeting and handshake.
var handshakeTimeout = 5 * time.Second

// maxSubscriptions caps one subscriber's topic prefixes; past it the
// subscriber is dropped.
const maxSubscriptions = 1024

// serve accepts until ctx ends; each connection's goroutines are owned
// here and waited for before serve returns.
func (s *server) serve(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	stop := context.AfterFunc(ctx, s.close)
	defer stop()
	var backoff time.Duration
	for {
		nc, err := s.ln.Accept()
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			// Anything else (EMFILE, ECONNABORTED) is retried after a
			// pause, as net/http does: one bad moment must not end the
			// events until the daemon restarts.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.p.o.Log.Warn().Err(err).Dur("retry_in", backoff).Msg("KV events: accept failed")
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			continue
		}
		backoff = 0
		if tc, ok := nc.(*net.TCPConn); ok && s.p.o.sndBuf > 0 {
			_ = tc.SetWriteBuffer(s.p.o.sndBuf)
		}
		e, evicted, reason := s.half.Enter(nc, netgate.SourceOf(nc))
		if evicted != nil {
			_ = evicted.Value().Close()
			s.p.o.Metrics.Refused.WithLabelValues(reason).Inc()
		}
		wg.Go(func() { s.handle(ctx, nc, e) })
	}
}

// handle runs one connection until it fails or the server closes; e is
// its place among the half-open connections until its handshake ends.
func (s *server) handle(ctx context.Context, nc net.Conn, e *netgate.Entry[net.Conn]) {
	typ := "PUB"
	if s.kind == kindReplay {
		typ = "ROUTER"
	}
	// A peer that never greets is cut when the server closes (close()
	// cannot see it yet, so watch ctx here), at the handshake's deadline,
	// or when newer connections evict it.
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer stop()
	_ = nc.SetDeadline(time.Now().Add(handshakeTimeout))
	c, err := zmtpAccept(nc, typ)
	if err == nil {
		err = nc.SetDeadline(time.Time{})
	}
	if !s.half.Leave(e) {
		_ = nc.Close() // evicted, and counted, while in its handshake
		return
	}
	if err != nil {
		_ = nc.Close()
		s.refused(nc, err, metrics.KVRefusedHandshake)
		return
	}
	pe := &peer{c: c}
	if s.kind == kindPub {
		pe.out = make(chan message, s.p.o.SubscriberQueue)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = c.Close()
		return
	}
	s.conns[pe] = struct{}{}
	s.mu.Unlock()
	if s.kind == kindPub {
		s.p.o.Metrics.Subscribers.Inc()
		defer s.p.o.Metrics.Subscribers.Dec()
	}
	defer func() {
		s.mu.Lock()
		delete(s.conns, pe)
		s.mu.Unlock()
		_ = c.Close()
	}()
	if s.kind == kindReplay {
		if err := s.serveReplay(pe); errors.Is(err, errProtocol) {
			s.refused(nc, err, metrics.KVRefusedFrame)
		}
		return
	}
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() { // the writer; it ends when the reader below does
		defer close(done)
		pe.write(quit)
	}()
	if err := pe.readSubscriptions(); errors.Is(err, errProtocol) {
		s.refused(nc, err, metrics.KVRefusedFrame)
	}
	close(quit)
	_ = c.Close() // ends the writer's blocked send, if any
	<-done
}

// write sends pe's queued messages until quit closes or a send fails.
func (pe *peer) write(quit <-chan struct{}) {
	for {
		select {
		case <-quit:
			return
		case m := <-pe.out:
			if err := pe.c.send(m.topic, seqBytes(m.seq), m.payload); err != nil {
				_ = pe.c.Close() // the reader fails next and handle ends
				return
			}
		}
	}
}

// readSubscriptions applies a subscriber's (un)subscribe messages (ZMTP
// 3.0: a first byte of 1 or 0, then the topic prefix; 3.1 also: SUBSCRIBE
// and CANCEL commands) until the connection fails. Other messages to a
// PUB are dropped, as libzmq's XPUB does.
func (pe *peer) readSubscriptions() error {
	for {
		msg, err := pe.c.recv()
		if err != nil {
			return err
		}
		sub := msg.sub
		if sub == nil {
			if len(msg.frames) != 1 || len(msg.frames[0]) == 0 || msg.frames[0][0] > 1 {
				continue
			}
			sub = &subscription{on: msg.frames[0][0] == 1, topic: msg.frames[0][1:]}
		}
		if !pe.apply(sub) {
			_ = pe.c.Close() // every event would scan an unbounded list
			return fmt.Errorf("%w: more than %d subscriptions", errProtocol, maxSubscriptions)
		}
	}
}

// apply adds or removes one subscription; false: too many.
func (pe *peer) apply(sub *subscription) bool {
	topic := string(sub.topic)
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if sub.on {
		if len(pe.topics) >= maxSubscriptions {
			return false
		}
		pe.topics = append(pe.topics, topic)
		return true
	}
	for i, t := range pe.topics {
		if t == topic {
			pe.topics = append(pe.topics[:i], pe.topics[i+1:]...)
			break
		}
	}
	return true
}

// wants: a subscription is a prefix of topic.
func (pe *peer) wants(topic []byte) bool {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	for _, t := range pe.topics {
		if strings.HasPrefix(string(topic), t) {
			return true
		}
	}
	return false
}

// fanOut queues m for every subscriber that wants it; a full queue drops
// it for that subscriber alone, and counts.
func (s *server) fanOut(m message) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for pe := range s.conns {
		if !pe.wants(m.topic) {
			continue
		}
		select {
		case pe.out <- m:
		default:
			s.p.o.Metrics.Dropped.WithLabelValues(metrics.KVDropSubscriberSlow).Add(float64(m.changes))
		}
	}
}

// subscribed counts subscribers with at least one subscription.
func (s *server) subscribed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for pe := range s.conns {
		pe.mu.Lock()
		if len(pe.topics) > 0 {
			n++
		}
		pe.mu.Unlock()
	}
	return n
}

// serveReplay answers vLLM's replay requests: a client (REQ or DEALER)
// sends the first sequence it missed as 8 big-endian bytes; it gets
// ["", seq, payload] for every remembered message from there on, then
// ["", -1 as 8 bytes, ""].
func (s *server) serveReplay(pe *peer) error {
	for {
		msg, err := pe.c.recv()
		if err != nil {
			return err
		}
		frames := msg.frames
		if msg.sub != nil {
			continue
		}
		if len(frames) == 2 && len(frames[0]) == 0 { // the REQ/DEALER delimiter
			frames = frames[1:]
		}
		if len(frames) != 1 || len(frames[0]) != 8 {
			return fmt.Errorf("%w: replay request of %d frames, want one 8-byte sequence", errProtocol, len(msg.frames))
		}
		s.p.o.Metrics.Replays.Inc()
		for _, m := range s.p.since(binary.BigEndian.Uint64(frames[0])) {
			if err := pe.c.send([]byte{}, seqBytes(m.seq), m.payload); err != nil {
				return err
			}
		}
		if err := pe.c.send([]byte{}, endSeq, []byte{}); err != nil {
			return err
		}
	}
}

// refused counts a connection pegad ended for a protocol violation or a
// handshake past its deadline, and says why at debug level: a flood of
// them must not flood the log (the metric shows it). A peer that just
// closed (a TCP health probe) is not counted.
func (s *server) refused(nc net.Conn, err error, reason string) {
	var ne net.Error
	switch {
	case errors.Is(err, errProtocol):
	case reason == metrics.KVRefusedHandshake && errors.As(err, &ne) && ne.Timeout():
		reason = metrics.KVRefusedTimeout
	default:
		s.p.o.Log.Debug().Err(err).Str("remote", nc.RemoteAddr().String()).Msg("KV events: connection ended")
		return
	}
	s.p.o.Metrics.Refused.WithLabelValues(reason).Inc()
	s.p.o.Log.Debug().Err(err).Str("remote", nc.RemoteAddr().String()).Str("reason", reason).Msg("KV events: connection refused")
}
