package conn

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/tcp"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
)

// testNICOptions are the options of a one-NIC tcp NIC set.
func testNICOptions(t *testing.T) NICOptions {
	t.Helper()
	prov, err := tcp.NewProvider(tcp.DeviceOptions{ListenAddr: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prov.Close() })
	infos, _ := prov.Devices()
	dev, err := prov.Open(infos[0].Name)
	if err != nil {
		t.Fatal(err)
	}
	return NICOptions{NodeID: "n", Incarnation: "i", Transport: "tcp", Devices: []ibv.Device{dev},
		Memory: mapMemory(t, 1<<20), Metrics: metricstest.New(), Log: zerolog.Nop()}
}

func noDial(string) (pegadv1.PeerServiceClient, error) { return nil, ErrClosed }

// TestNICsMetricsRequired: metrics are a required option, never a private
// registry made behind the caller's back.
func TestNICsMetricsRequired(t *testing.T) {
	o := testNICOptions(t)
	o.Metrics = nil
	if s, err := NewNICs(o); err == nil || !strings.Contains(err.Error(), "Metrics is required") {
		if s != nil {
			_ = s.Close()
		}
		t.Fatalf("NewNICs without metrics: %v, want an error naming Metrics", err)
	}
}

// TestNICsOneHalfOfEach: a NIC set has at most one Dialer and one
// Acceptor, refuses to close under them, and closes once they are closed.
func TestNICsOneHalfOfEach(t *testing.T) {
	s, err := NewNICs(testNICOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	d, err := NewDialer(s, DialerOptions{Dial: noDial})
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewAcceptor(s, AcceptorOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewDialer(s, DialerOptions{Dial: noDial}); err == nil {
		t.Error("a second Dialer over one NIC set was made")
	}
	if _, err := NewAcceptor(s, AcceptorOptions{}); err == nil {
		t.Error("a second Acceptor over one NIC set was made")
	}
	if err := s.Close(); err == nil {
		t.Error("NICs closed under an open Dialer and Acceptor")
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err == nil {
		t.Error("NICs closed under an open Acceptor")
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close after both halves: %v", err)
	}
	if _, err := d.Get(ctxT(t, time50ms), "peer:1"); err != ErrClosed {
		t.Errorf("Get after Close: %v, want ErrClosed", err)
	}
}

// TestDialerProbeNeedsKeepalive: a keepalive needs its scratch page
// registered on the NICs.
func TestDialerProbeNeedsKeepalive(t *testing.T) {
	s, err := NewNICs(testNICOptions(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if d, err := NewDialer(s, DialerOptions{Dial: noDial, ProbeInterval: time50ms}); err == nil {
		_ = d.Close()
		t.Fatal("a Dialer with a ProbeInterval was made over NICs without Keepalive")
	}
}

const time50ms = 50 * time.Millisecond
