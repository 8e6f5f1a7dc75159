package peer

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/connectivity"
)

var errCertRefused = errors.New("certificate refused: the peer refused this node's certificate")

// TestRefusalBackoff: a peer that refused a certificate is not dialled
// (Get fails at once, naming the refusal and when it dials again) and its
// channel is closed; the backoff doubles with each further refusal up to
// its cap; a refusal reported again while one is in force changes
// nothing; Forget (a certificate reload) lets Get dial at once.
func TestRefusalBackoff(t *testing.T) {
	addr, _ := startServer(t)
	c := NewClients()
	t.Cleanup(func() { _ = c.Close() })
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }

	cl, err := c.Get(addr)
	if err != nil {
		t.Fatal(err)
	}
	cc := cl.(client).cc
	until, ok := c.Refused(addr, errCertRefused)
	if !ok || !until.Equal(now.Add(RefusalBackoff)) {
		t.Fatalf("Refused = %v, %v; want recorded until +%v", until, ok, RefusalBackoff)
	}
	if _, ok := c.Refused(addr, errCertRefused); ok {
		t.Fatal("a second report within the backoff was recorded again")
	}
	_, err = c.Get(addr)
	var re *RefusedError
	if !errors.As(err, &re) || !errors.Is(err, ErrRefusedRecently) || !errors.Is(err, errCertRefused) ||
		!strings.Contains(err.Error(), "not redialling "+addr) {
		t.Fatalf("Get in the backoff: %v, want a RefusedError wrapping the refusal", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for cc.GetState() != connectivity.Shutdown && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s := cc.GetState(); s != connectivity.Shutdown {
		t.Fatalf("refused peer's channel is %v, want closed (no background redials)", s)
	}

	// Each refusal after a backoff passed doubles the next, up to the cap.
	want := RefusalBackoff
	for range 8 {
		now = now.Add(want)
		if _, err := c.Get(addr); err != nil {
			t.Fatalf("Get after the backoff: %v", err)
		}
		want = min(2*want, RefusalBackoffMax)
		if until, ok := c.Refused(addr, errCertRefused); !ok || until.Sub(now) != want {
			t.Fatalf("backoff %v, want %v", until.Sub(now), want)
		}
	}
	if want != RefusalBackoffMax {
		t.Fatalf("backoff reached %v, want the cap %v", want, RefusalBackoffMax)
	}

	c.Forget()
	if _, err := c.Get(addr); err != nil {
		t.Fatalf("Get after Forget: %v", err)
	}
	if until, _ := c.Refused(addr, errCertRefused); until.Sub(now) != RefusalBackoff {
		t.Fatalf("backoff after Forget %v, want the first %v", until.Sub(now), RefusalBackoff)
	}
}
