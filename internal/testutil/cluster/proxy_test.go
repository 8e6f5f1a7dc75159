package cluster

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// echoServer echoes each line back.
func echoServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); <-done })
	return l.Addr().String()
}

// roundTrip sends a line through c and waits up to d for it to come back.
func roundTrip(c net.Conn, d time.Duration) (time.Duration, error) {
	start := time.Now()
	_ = c.SetDeadline(start.Add(d))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	_, err := bufio.NewReader(c).ReadString('\n')
	return time.Since(start), err
}

func TestProxyFaults(t *testing.T) {
	p := NewProxy(t, echoServer(t))
	dial := func() net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", p.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c := dial()
	if _, err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	p.Delay(150 * time.Millisecond) // each way: ≥ 300 ms a round trip
	if rt, err := roundTrip(c, 3*time.Second); err != nil || rt < 300*time.Millisecond {
		t.Fatalf("delayed round trip: %v, %v (want ≥ 300ms)", rt, err)
	}
	p.Restore()

	p.Blackhole()
	if _, err := roundTrip(c, 300*time.Millisecond); err == nil {
		t.Fatal("an answer came through a blackhole")
	}
	p.Restore()

	c = dial()
	if _, err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
	p.Cut()
	if _, err := roundTrip(c, 2*time.Second); err == nil {
		t.Fatal("a cut connection still answered")
	}
	if _, err := roundTrip(dial(), 2*time.Second); err == nil {
		t.Fatal("a connection made while cut answered")
	}
	p.Restore()

	c = dial()
	if _, err := roundTrip(c, 2*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
	p.Reset()
	if _, err := roundTrip(c, 2*time.Second); err == nil {
		t.Fatal("a reset connection still answered")
	}
	if _, err := roundTrip(dial(), 2*time.Second); err != nil {
		t.Fatalf("a new connection after Reset: %v", err)
	}
}
