package testutil

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Streams are n plain connections of one network, carrying bytes from
// send[i] to recv[i]: the baseline that paired benchmarks measure pegad's
// data paths against in the same run.
type Streams struct {
	send, recv []net.Conn
}

// NewStreams listens on network/addr ("127.0.0.1:0", or a unix socket path)
// and connects n streams; they are closed at cleanup.
func NewStreams(tb testing.TB, network, addr string, n int) *Streams {
	tb.Helper()
	ln, err := net.Listen(network, addr)
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	s := &Streams{}
	tb.Cleanup(func() {
		for _, c := range append(s.send, s.recv...) {
			c.Close()
		}
	})
	for range n {
		c, err := net.Dial(network, ln.Addr().String())
		if err != nil {
			tb.Fatal(err)
		}
		s.send = append(s.send, c)
		a, err := ln.Accept()
		if err != nil {
			tb.Fatal(err)
		}
		s.recv = append(s.recv, a)
	}
	return s
}

// Copy moves src into dst (same length) over the streams, each carrying an
// equal share in writes of chunk bytes, and returns when all of it arrived.
func (s *Streams) Copy(tb testing.TB, src, dst []byte, chunk int) {
	n := len(s.send)
	per := len(src) / n
	var wg sync.WaitGroup
	for i := range n {
		part, out := src[i*per:(i+1)*per], dst[i*per:(i+1)*per]
		wg.Go(func() {
			for off := 0; off < len(part); off += chunk {
				if _, err := s.send[i].Write(part[off:min(off+chunk, len(part))]); err != nil {
					tb.Error(err)
					return
				}
			}
		})
		wg.Go(func() {
			if _, err := io.ReadFull(s.recv[i], out); err != nil {
				tb.Error(err)
			}
		})
	}
	wg.Wait()
}
