package daemon

// Tests of unexported parts, in the package. The tests that start nodes
// are in package daemon_test and start them through internal/testutil/cluster.

import (
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/peertls"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestConnectAttr: QPs on the tcp provider get a retry budget a loaded
// host cannot exhaust by scheduling delay alone; verbs keeps the default.
func TestConnectAttr(t *testing.T) {
	tests := []struct {
		transport string
		min, max  time.Duration
	}{
		{config.TransportTCP, 4 * time.Second, 5 * time.Second},
		{config.TransportVerbs, 500 * time.Millisecond, 600 * time.Millisecond},
	}
	for _, tc := range tests {
		d := config.Default()
		a := connectAttr(tc.transport, &d)
		if b := a.RetryBudget(); b < tc.min || b > tc.max {
			t.Errorf("%s: retry budget %v, want %v..%v", tc.transport, b, tc.min, tc.max)
		}
		want := ibv.DefaultConnectAttr()
		a.Timeout = want.Timeout
		if a != want {
			t.Errorf("%s: attributes other than Timeout changed: %+v", tc.transport, a)
		}
	}
}

// TestQoSSettings: traffic-class and service-level reach every QP's
// attributes; gid-index and pkey-index the verbs provider's options.
func TestQoSSettings(t *testing.T) {
	cfg := config.Default()
	cfg.TrafficClass, cfg.ServiceLevel, cfg.GIDIndex, cfg.PKeyIndex = 106, 3, 2, 1
	if a := connectAttr(config.TransportVerbs, &cfg); a.TrafficCls != 106 || a.SL != 3 {
		t.Fatalf("connect attributes %+v: want traffic class 106, SL 3", a)
	}
	if o := verbsOptions(&cfg); !o.ForceGIDIndex || o.GIDIndex != 2 || o.PKeyIndex != 1 {
		t.Fatalf("verbs options %+v: want GID index 2 forced, P_Key index 1", o)
	}
	cfg = config.Default()
	if o := verbsOptions(&cfg); o.ForceGIDIndex || o.PKeyIndex != 0 {
		t.Fatalf("default verbs options %+v: want the GID chosen, P_Key index 0", o)
	}
}

func TestBoundAddr(t *testing.T) {
	tests := []struct {
		configured string
		bound      net.Addr
		want       string
	}{
		{"0.0.0.0:50055", &net.TCPAddr{IP: net.IPv6unspecified, Port: 50055}, "0.0.0.0:50055"},
		{"0.0.0.0:0", &net.TCPAddr{IP: net.IPv6unspecified, Port: 41000}, "0.0.0.0:41000"},
		{":9464", &net.TCPAddr{IP: net.IPv6unspecified, Port: 9464}, "0.0.0.0:9464"},
		{"[::]:0", &net.TCPAddr{IP: net.IPv6unspecified, Port: 7}, "[::]:7"},
		{"127.0.0.1:0", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 5}, "127.0.0.1:5"},
	}
	for _, tc := range tests {
		if got := boundAddr(tc.configured, tc.bound); got != tc.want {
			t.Errorf("boundAddr(%s, %s) = %s, want %s", tc.configured, tc.bound, got, tc.want)
		}
	}
}

func TestIEC(t *testing.T) {
	for n, want := range map[uint64]string{512: "512 B", 1 << 20: "1.0 MiB", 16_700_000_000: "15.6 GiB", 3 << 40: "3.0 TiB"} {
		if got := iec(n); got != want {
			t.Errorf("iec(%d) = %q, want %q", n, got, want)
		}
	}
}

// TestUnhealthyReasons: what stops the watchdog.
func TestUnhealthyReasons(t *testing.T) {
	now := time.Now()
	peer := "peer"
	tests := []struct {
		name      string
		lastSweep time.Time
		down      *string
		want      string // substring; "" means healthy
	}{
		{"healthy", now.Add(-time.Second), nil, ""},
		{"sweeper slow but within a few intervals", now.Add(-minSweepStale + 100*time.Millisecond), nil, ""},
		{"sweeper stalled", now.Add(-time.Minute), nil, "lock sweeper has not run"},
		{"server down", now, &peer, "peer server is down"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := &Daemon{cfg: config.Config{GCInterval: 100 * time.Millisecond}}
			d.sweeps.last.Store(tc.lastSweep.UnixNano())
			d.serverDown.Store(tc.down)
			got := d.unhealthy(now)
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("unhealthy = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestPlaintextWarning: a plaintext peer port off loopback is warned about
// at start; on loopback, or with TLS, it is not (a real start on loopback:
// TestPlaintextWarningLoopbackStart).
func TestPlaintextWarning(t *testing.T) {
	const warning = "Peer port is plaintext on a non-loopback address"
	logs := &testutil.LogBuffer{}
	d := &Daemon{log: zerolog.New(logs)}
	for _, c := range []struct {
		addr string
		tls  bool
		warn bool
	}{
		{"127.0.0.1:1", false, false},
		{"[::1]:1", false, false},
		{"0.0.0.0:1", false, true},
		{"10.1.2.3:1", false, true},
		{"10.1.2.3:1", true, false},
	} {
		d.tls = nil
		if c.tls {
			d.tls = &peertls.Source{}
		}
		before := strings.Count(logs.String(), warning)
		d.warnPlaintext(net.TCPAddrFromAddrPort(mustAddrPort(t, c.addr)))
		if got := strings.Count(logs.String(), warning) > before; got != c.warn {
			t.Errorf("%s tls=%v: warned %v, want %v", c.addr, c.tls, got, c.warn)
		}
	}
}

func mustAddrPort(t *testing.T, s string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}

// TestRetryBudgetSettings: qp-timeout and qp-retry-count reach every
// QP's attributes (-1 keeps the transport's default timeout), and
// cq-busy-poll the verbs provider's CQ spin (0: none).
func TestRetryBudgetSettings(t *testing.T) {
	tests := []struct {
		name               string
		transport          string
		timeout, retries   int
		spin               time.Duration
		wantTimeout, wantR uint8
		wantSpin           time.Duration
	}{
		{"defaults verbs", config.TransportVerbs, -1, 7, 20 * time.Microsecond, 14, 7, 20 * time.Microsecond},
		{"defaults tcp", config.TransportTCP, -1, 7, 20 * time.Microsecond, tcpConnectTimeout, 7, 20 * time.Microsecond},
		{"set", config.TransportVerbs, 18, 3, 0, 18, 3, -1},
		{"set tcp", config.TransportTCP, 12, 0, time.Millisecond, 12, 0, time.Millisecond},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.QPTimeout, cfg.QPRetryCount, cfg.CQBusyPoll = tc.timeout, tc.retries, tc.spin
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			a := connectAttr(tc.transport, &cfg)
			if a.Timeout != tc.wantTimeout || a.RetryCnt != tc.wantR {
				t.Errorf("timeout %d, retries %d; want %d, %d", a.Timeout, a.RetryCnt, tc.wantTimeout, tc.wantR)
			}
			if o := verbsOptions(&cfg); o.CQSpin != tc.wantSpin {
				t.Errorf("CQSpin %v, want %v", o.CQSpin, tc.wantSpin)
			}
		})
	}
}
