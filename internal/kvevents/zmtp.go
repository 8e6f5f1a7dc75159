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

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/security/null"

	"github.com/pegaflow/pegad/internal/metrics"
)

// The ZeroMQ side. github.com/go-zeromq/zmq4 (pure Go, so CGO_ENABLED=0
// builds keep the publisher) does the ZMTP greeting and NULL handshake on
// each accepted connection (zmq4.Open) and frames the messages. Its own
// PUB socket is not used: it sends to every subscriber in turn from one
// queue, so one subscriber that stops reading stalls the others, and it
// drops past its high-water mark without saying so. Here every
// subscriber has its own bounded queue and writer goroutine, and what a
// full queue drops is counted.

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
	return &server{kind: kind, ln: ln, p: p, conns: map[*peer]struct{}{}}, nil
}

// server accepts ZMTP connections on one endpoint. Lock order: server.mu,
// then a peer's mu (fanOut, subscribed); neither is held across network
// I/O.
type server struct {
	kind serverKind
	ln   net.Listener
	p    *Publisher

	mu     sync.Mutex // guards conns and closed
	conns  map[*peer]struct{}
	closed bool
}

// peer is one connection: a subscriber (topics, out) or a replay client.
type peer struct {
	c   *zmq4.Conn
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
		wg.Go(func() { s.handle(ctx, nc) })
	}
}

// handle runs one connection until it fails or the server closes.
func (s *server) handle(ctx context.Context, nc net.Conn) {
	typ := zmq4.Pub
	if s.kind == kindReplay {
		typ = zmq4.Router
	}
	// Open runs the handshake; a peer that never greets is cut when the
	// server closes (close() cannot see it yet, so watch ctx here).
	stop := context.AfterFunc(ctx, func() { _ = nc.Close() })
	defer stop()
	// A peer that connects and never greets holds a goroutine and a file
	// only for the handshake's deadline.
	_ = nc.SetDeadline(time.Now().Add(handshakeTimeout))
	c, err := zmq4.Open(nc, null.Security(), typ, zmq4.SocketIdentity(""), true, nil)
	if err == nil {
		err = nc.SetDeadline(time.Time{})
	}
	if err != nil {
		_ = nc.Close()
		s.p.o.Log.Debug().Err(err).Str("remote", nc.RemoteAddr().String()).Msg("KV events: handshake failed")
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
		s.serveReplay(pe)
		return
	}
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() { // the writer; it ends when the reader below does
		defer close(done)
		pe.write(quit)
	}()
	pe.readSubscriptions()
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
			if err := pe.c.SendMsg(zmq4.NewMsgFrom(m.topic, seqBytes(m.seq), m.payload)); err != nil {
				_ = pe.c.Close() // the reader fails next and handle ends
				return
			}
		}
	}
}

// readSubscriptions applies a subscriber's (un)subscribe messages (ZMTP
// 3.0: a first byte of 1 or 0, then the topic prefix) until the
// connection fails.
func (pe *peer) readSubscriptions() {
	for {
		msg, err := pe.c.RecvMsg()
		if err != nil {
			return
		}
		if msg.Type == zmq4.CmdMsg || len(msg.Frames) == 0 || len(msg.Frames[0]) == 0 {
			continue
		}
		f := msg.Frames[0]
		topic := string(f[1:])
		pe.mu.Lock()
		switch f[0] {
		case 1:
			if len(pe.topics) >= maxSubscriptions {
				pe.mu.Unlock()
				_ = pe.c.Close() // every event would scan an unbounded list
				return
			}
			pe.topics = append(pe.topics, topic)
		case 0:
			for i, t := range pe.topics {
				if t == topic {
					pe.topics = append(pe.topics[:i], pe.topics[i+1:]...)
					break
				}
			}
		}
		pe.mu.Unlock()
	}
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
func (s *server) serveReplay(pe *peer) {
	for {
		msg, err := pe.c.RecvMsg()
		if err != nil {
			return
		}
		frames := msg.Frames
		if msg.Type == zmq4.CmdMsg {
			continue
		}
		if len(frames) == 2 && len(frames[0]) == 0 { // the REQ/DEALER delimiter
			frames = frames[1:]
		}
		if len(frames) != 1 || len(frames[0]) != 8 {
			s.p.o.Log.Warn().Int("frames", len(msg.Frames)).Msg("KV events: invalid replay request")
			continue
		}
		s.p.o.Metrics.Replays.Inc()
		for _, m := range s.p.since(binary.BigEndian.Uint64(frames[0])) {
			if err := pe.c.SendMsg(zmq4.NewMsgFrom([]byte{}, seqBytes(m.seq), m.payload)); err != nil {
				return
			}
		}
		if err := pe.c.SendMsg(zmq4.NewMsgFrom([]byte{}, endSeq, []byte{})); err != nil {
			return
		}
	}
}
