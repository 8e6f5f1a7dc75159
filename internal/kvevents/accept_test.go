package kvevents

import (
	"context"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/metrics/metricstest"
)

// flakyListener fails its first Accept with EMFILE (the process ran out of
// files), then accepts as usual.
type flakyListener struct {
	net.Listener
	failed atomic.Bool
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if !l.failed.Swap(true) {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Err: syscall.EMFILE}
	}
	return l.Listener.Accept()
}

// startServer serves a PUB server on a loopback listener wrapped by wrap;
// it is stopped at cleanup and serve's goroutines waited for.
func startServer(t *testing.T, wrap func(net.Listener) net.Listener) *server {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Publisher{o: Options{Log: zerolog.Nop(), SubscriberQueue: 8, Metrics: metricstest.NewKVEvents()}}
	s := newServer(kindPub, wrap(ln), p)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); s.serve(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s
}

// TestAcceptErrorDoesNotStopServer: one failed Accept (EMFILE) ended serve
// for good, so no subscriber could connect until the daemon restarted
// (found in review). Now it is retried and the next connection is served.
func TestAcceptErrorDoesNotStopServer(t *testing.T) {
	fl := &flakyListener{}
	s := startServer(t, func(ln net.Listener) net.Listener { fl.Listener = ln; return fl })
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	waitFor("the failed accept", fl.failed.Load)
	sub := dialSub(t, s.ln.Addr().String())
	defer sub.Close()
	waitFor("the subscriber to be served", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns) == 1
	})
}

// TestSilentPeerCutAtHandshakeDeadline: a connection that never greets is
// closed by the server once the handshake's deadline passes, not held
// until the server closes.
func TestSilentPeerCutAtHandshakeDeadline(t *testing.T) {
	old := handshakeTimeout
	handshakeTimeout = 200 * time.Millisecond
	t.Cleanup(func() { handshakeTimeout = old })
	s := startServer(t, func(ln net.Listener) net.Listener { return ln })
	nc, err := net.Dial("tcp", s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// Read whatever the server greets with, until it closes the conn.
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	buf := make([]byte, 256)
	for {
		if _, err := nc.Read(buf); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				t.Fatal("a peer that never greets is still connected after 5 s")
			}
			break
		}
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("silent peer cut after %v, want about the 200ms deadline", d)
	}
}

// dialSub connects a go-zeromq SUB socket to addr (host:port).
func dialSub(t *testing.T, addr string) zmq4.Socket {
	t.Helper()
	sub := zmq4.NewSub(context.Background())
	if err := sub.Dial("tcp://" + addr); err != nil {
		t.Fatalf("SUB dial %s: %v", addr, err)
	}
	return sub
}
