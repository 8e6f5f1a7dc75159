package kvevents

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/netgate"
)

// What a ZeroMQ client sends, built by hand so that tests can bend it.

func clientGreeting(major byte, mechanism string) []byte {
	g := make([]byte, greetingLen)
	g[0], g[9], g[10], g[11] = 0xFF, 0x7F, major, 0
	copy(g[12:32], mechanism)
	return g
}

// frameHeader declares a frame of size bytes (long form).
func frameHeader(flags byte, size uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{flags | flagLong}, size)
}

func shortFrame(flags byte, body []byte) []byte {
	return append([]byte{flags, byte(len(body))}, body...)
}

func command(name string, data []byte) []byte {
	return shortFrame(flagCommand, append(append([]byte{byte(len(name))}, name...), data...))
}

func ready(socketType string) []byte {
	return command("READY", appendProperty(nil, "Socket-Type", socketType))
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

// TestHostileBytesRefused: each of these ended the daemon or exhausted its
// memory under go-zeromq/zmq4 (issue 33: the 2^50 frame panicked in
// conn.go:416, "BOGUS" in socket_types.go, the short property in
// Property.Write, 2^40 ran out of memory, 2^31 grew RSS by GBs). Now each
// ends only its own connection, counted, with no allocation for the
// declared size, and the server keeps serving.
func TestHostileBytesRefused(t *testing.T) {
	greet := clientGreeting(3, "NULL")
	sub := cat(greet, ready("SUB"))
	for _, c := range []struct {
		name   string
		send   []byte
		reason string
	}{
		{"frame of 2^50 bytes", cat(sub, frameHeader(0, 1<<50)), metrics.KVRefusedFrame},
		{"frame of 2^40 bytes", cat(sub, frameHeader(0, 1<<40)), metrics.KVRefusedFrame},
		{"frame of 2^36 bytes", cat(sub, frameHeader(flagMore, 1<<36)), metrics.KVRefusedFrame},
		{"frame of 2^31 bytes", cat(sub, frameHeader(0, 1<<31)), metrics.KVRefusedFrame},
		{"READY of 2^50 bytes", cat(greet, frameHeader(flagCommand, 1<<50)), metrics.KVRefusedHandshake},
		{"unknown socket type", cat(greet, ready("BOGUS")), metrics.KVRefusedHandshake},
		{"incompatible socket type", cat(greet, ready("PUB")), metrics.KVRefusedHandshake},
		{"property name past the end", cat(greet, command("READY", []byte{7, 'S', 'o', 'c', 'k', 'e'})), metrics.KVRefusedHandshake},
		{"property value past the end", cat(greet, command("READY", []byte{1, 'x', 0xFF, 0xFF, 0xFF, 0xFF, 'v'})), metrics.KVRefusedHandshake},
		{"no socket type", cat(greet, command("READY", nil)), metrics.KVRefusedHandshake},
		{"CURVE", cat(clientGreeting(3, "CURVE"), ready("SUB")), metrics.KVRefusedHandshake},
		{"ZMTP 2.0", cat(clientGreeting(1, "NULL")), metrics.KVRefusedHandshake},
		{"not a greeting", bytes.Repeat([]byte("GET / HTTP/1.1\r\n"), 4), metrics.KVRefusedHandshake},
		{"message before READY", cat(greet, shortFrame(0, []byte{1})), metrics.KVRefusedHandshake},
		{"reserved flag bits", cat(sub, shortFrame(0x80, []byte{1})), metrics.KVRefusedFrame},
		{"command with MORE", cat(sub, shortFrame(flagCommand|flagMore, []byte{4, 'P', 'I', 'N', 'G', 0, 0})), metrics.KVRefusedFrame},
		{"empty command name", cat(sub, shortFrame(flagCommand, []byte{0})), metrics.KVRefusedFrame},
		{"PING context too long", cat(sub, command("PING", make([]byte, 2+17))), metrics.KVRefusedFrame},
		{"too many frames", cat(sub, bytes.Repeat(shortFrame(flagMore, []byte("x")), maxFrames+1)), metrics.KVRefusedFrame},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := startServer(t, func(ln net.Listener) net.Listener { return ln })
			before := testutil.ToFloat64(s.p.o.Metrics.Refused.WithLabelValues(c.reason))
			heap := heapInUse()
			nc := dial(t, s)
			if _, err := nc.Write(c.send); err != nil {
				t.Fatal(err)
			}
			waitClosed(t, nc)
			waitFor(t, func() bool {
				return testutil.ToFloat64(s.p.o.Metrics.Refused.WithLabelValues(c.reason)) == before+1
			})
			if grown := heapInUse() - heap; grown > 16<<20 {
				t.Errorf("heap grew by %d bytes for one hostile connection", grown)
			}
			// The server still serves a well-behaved subscriber.
			good := dial(t, s)
			if _, err := good.Write(cat(greet, ready("SUB"), shortFrame(0, []byte{1, 'k', 'v'}))); err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() bool { return s.subscribed() == 1 })
		})
	}
}

// TestZMTP31Commands: a ZMTP 3.1 peer may subscribe with a SUBSCRIBE
// command, cancel with CANCEL, and PING; PING gets a PONG with its context.
func TestZMTP31Commands(t *testing.T) {
	s := startServer(t, func(ln net.Listener) net.Listener { return ln })
	nc := dial(t, s)
	if _, err := nc.Write(cat(clientGreeting(3, "NULL"), ready("XSUB"), command("SUBSCRIBE", []byte("kv@")))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.subscribed() == 1 })
	if _, err := nc.Write(cat(command("PING", []byte{0, 10, 'c', 't', 'x'}), command("CANCEL", []byte("kv@")))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.subscribed() == 0 })
	// The server's greeting, its READY, then the PONG.
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, greetingLen)
	if _, err := io.ReadFull(nc, buf); err != nil {
		t.Fatal(err)
	}
	c := &zmtpConn{nc: nc, r: bufio.NewReaderSize(nc, maxFrame)}
	if name, _, err := c.readCommand(); err != nil || name != "READY" {
		t.Fatalf("server's READY: %q, %v", name, err)
	}
	if name, data, err := c.readCommand(); err != nil || name != "PONG" || string(data) != "ctx" {
		t.Fatalf("PONG: %q %q, %v", name, data, err)
	}
}

// TestHalfOpenBounded: 1,000 connections that never greet hold at most
// netgate.DefaultMaxHalfOpenPerSource goroutines and files between them (each newer one
// evicts the oldest of its source), and a real subscriber still gets in.
func TestHalfOpenBounded(t *testing.T) {
	s := startServer(t, func(ln net.Listener) net.Listener { return ln })
	base := runtime.NumGoroutine()
	conns := make([]net.Conn, 0, 1000)
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
	})
	for range 1000 {
		conns = append(conns, dial(t, s))
	}
	waitFor(t, func() bool {
		return testutil.ToFloat64(s.p.o.Metrics.Refused.WithLabelValues(metrics.KVRefusedSourceLimit)) == 1000-netgate.DefaultMaxHalfOpenPerSource
	})
	if n := s.half.Waiting(); n > netgate.DefaultMaxHalfOpenPerSource {
		t.Fatalf("%d connections in their handshake, at most %d allowed", n, netgate.DefaultMaxHalfOpenPerSource)
	}
	if g := runtime.NumGoroutine() - base; g > netgate.DefaultMaxHalfOpenPerSource+16 {
		t.Fatalf("%d goroutines for 1,000 silent connections", g)
	}
	good := dial(t, s)
	if _, err := good.Write(cat(clientGreeting(3, "NULL"), ready("SUB"), shortFrame(0, []byte{1}))); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return s.subscribed() == 1 })
}

// FuzzZMTPAccept: whatever a client sends, the server's side of the
// handshake and framing returns an error or bounded frames, and never
// panics or allocates for a declared size.
func FuzzZMTPAccept(f *testing.F) {
	greet := clientGreeting(3, "NULL")
	f.Add(cat(greet, ready("SUB"), shortFrame(0, []byte{1, 'k'})))
	f.Add(cat(greet, ready("REQ"), shortFrame(flagMore, nil), shortFrame(0, make([]byte, 8))))
	f.Add(cat(greet, ready("SUB"), frameHeader(0, 1<<50)))
	f.Add(cat(greet, ready("BOGUS")))
	f.Add(cat(greet, command("READY", []byte{7, 'S', 'o', 'c', 'k', 'e'})))
	f.Add(cat(greet, ready("XSUB"), command("PING", []byte{0, 1, 'x'}), command("SUBSCRIBE", []byte("a"))))
	f.Fuzz(func(t *testing.T, in []byte) {
		for _, typ := range []string{"PUB", "ROUTER"} {
			c, err := zmtpAccept(&bytesConn{r: bytes.NewReader(in)}, typ)
			if err != nil {
				continue
			}
			for {
				m, err := c.recv()
				if err != nil {
					break
				}
				if len(m.frames) > maxFrames {
					t.Fatalf("%d frames", len(m.frames))
				}
				for _, fr := range m.frames {
					if len(fr) > maxFrame {
						t.Fatalf("frame of %d bytes", len(fr))
					}
				}
			}
		}
	})
}

// bytesConn is a net.Conn that reads in and discards what is written.
type bytesConn struct {
	net.Conn
	r *bytes.Reader
}

func (c *bytesConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c *bytesConn) Write(p []byte) (int, error) { return len(p), nil }
func (c *bytesConn) Close() error                { return nil }

func dial(t *testing.T, s *server) net.Conn {
	t.Helper()
	nc, err := net.Dial("tcp", s.ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nc.Close() })
	return nc
}

// waitClosed reads until the server closes nc.
func waitClosed(t *testing.T, nc net.Conn) {
	t.Helper()
	_ = nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err := io.Copy(io.Discard, nc)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("the server did not close a hostile connection in 5 s")
	}
}

func heapInUse() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapInuse)
}
