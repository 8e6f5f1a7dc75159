package netgate

import (
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// gatedServer serves l: a connection sends "helo" (its first step), is
// answered "ok" and kept open until the client closes it. live counts its
// handler goroutines.
type gatedServer struct {
	l       *Listener
	live    atomic.Int64
	mu      sync.Mutex // guards refused
	refused map[string]int
}

func serveGated(t *testing.T, network, addr string, o Options) *gatedServer {
	t.Helper()
	raw, err := net.Listen(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	s := &gatedServer{refused: map[string]int{}}
	o.Step = Bytes(4)
	o.Refused = func(r string) { s.mu.Lock(); s.refused[r]++; s.mu.Unlock() }
	s.l = NewListener(raw, o)
	var wg sync.WaitGroup
	t.Cleanup(func() { s.l.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := s.l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			s.live.Add(1)
			go func() {
				defer wg.Done()
				defer s.live.Add(-1)
				defer c.Close()
				var b [4]byte
				if _, err := io.ReadFull(c, b[:]); err != nil {
					return
				}
				_, _ = c.Write([]byte("ok"))
				_, _ = io.Copy(io.Discard, c)
			}()
		}
	}()
	return s
}

func (s *gatedServer) count(reason string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.refused[reason]
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !f(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// hello dials addr, says hello and waits for the answer.
func hello(t *testing.T, network, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var b [2]byte
	if _, err := c.Write([]byte("helo")); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(c, b[:]); err != nil || string(b[:]) != "ok" {
		t.Fatalf("hello answered %q, %v", b, err)
	}
	return c
}

// 1,000 connections that never say hello leave at most the per-source
// limit waiting (and as many handler goroutines), the rest evicted oldest
// first and counted; a real client gets through during the flood, and once
// past its hello is never evicted.
func TestListenerBoundsFlood(t *testing.T) {
	const flood, perSource = 1000, 64
	s := serveGated(t, "tcp", "127.0.0.1:0", Options{Timeout: time.Minute})
	addr := s.l.Addr().String()
	early := hello(t, "tcp", addr)
	var conns []net.Conn
	for i := 0; i < flood; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		defer c.Close()
		conns = append(conns, c)
		if i == flood/2 {
			hello(t, "tcp", addr)
		}
	}
	eventually(t, "the flood evicted", func() bool { return s.count(ReasonSourceLimit) == flood-perSource })
	if n := s.l.Waiting(); n != perSource {
		t.Errorf("%d half-open connections, want %d", n, perSource)
	}
	eventually(t, "evicted handlers gone", func() bool { return s.live.Load() == perSource+2 })
	// The oldest were closed: the first reads EOF, the newest is still open.
	_ = conns[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := conns[0].Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("oldest flood connection: read %v, want EOF", err)
	}
	_ = conns[flood-1].SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := conns[flood-1].Read(make([]byte, 1)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("newest flood connection: read %v, want it still open", err)
	}
	if _, err := early.Write([]byte("x")); err != nil {
		t.Errorf("connection past its hello broken by the flood: %v", err)
	}
	hello(t, "tcp", addr)
}

// A connection still half-open at its deadline is closed and counted; one
// that passed its first step is not.
func TestListenerTimeout(t *testing.T) {
	s := serveGated(t, "tcp", "127.0.0.1:0", Options{Timeout: 100 * time.Millisecond})
	addr := s.l.Addr().String()
	silent, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	good := hello(t, "tcp", addr)
	_ = silent.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Errorf("silent connection: read %v, want EOF at its deadline", err)
	}
	eventually(t, "the timeout counted", func() bool { return s.count(ReasonTimeout) == 1 })
	time.Sleep(150 * time.Millisecond)
	if _, err := good.Write([]byte("x")); err != nil {
		t.Errorf("connection past its hello closed at the deadline: %v", err)
	}
	if n := s.l.Waiting(); n != 0 {
		t.Errorf("%d half-open after the timeout, want 0", n)
	}
}

// On a unix socket the source is the peer's uid: one process's flood is
// bounded by the per-source limit, and a wrapper's NetConn and Pass reach
// the accepted *net.UnixConn.
func TestListenerUnix(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s")
	s := serveGated(t, "unix", path, Options{MaxHalfOpenPerSource: 4})
	for i := 0; i < 10; i++ {
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	eventually(t, "evictions by uid", func() bool { return s.count(ReasonSourceLimit) == 6 })
	hello(t, "unix", path)

	raw, err := net.Listen("unix", filepath.Join(t.TempDir(), "p"))
	if err != nil {
		t.Fatal(err)
	}
	l := NewListener(raw, Options{})
	defer l.Close()
	c, err := net.Dial("unix", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ac, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	if _, ok := Unwrap(ac).(*net.UnixConn); !ok {
		t.Errorf("Unwrap = %T, want *net.UnixConn", Unwrap(ac))
	}
	if src := SourceOf(Unwrap(ac)); !src.hasUID {
		t.Errorf("unix source %v, want a uid", src)
	}
	Pass(wrapped{ac})
	if n := l.Waiting(); n != 0 {
		t.Errorf("%d half-open after Pass through a wrapper, want 0", n)
	}
}

// wrapped is a connection wrapped by another layer, as TLS wraps one.
type wrapped struct{ net.Conn }

func (w wrapped) NetConn() net.Conn { return w.Conn }
