package daemon

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/pool"
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

// TestStartExtendsTimeout: while Start runs, systemd is asked for more
// time (EXTEND_TIMEOUT_USEC), and never after READY=1.
func TestStartExtendsTimeout(t *testing.T) {
	old := extendEvery
	extendEvery = time.Millisecond
	t.Cleanup(func() { extendEvery = old })
	n := startNode(t, testConfig(t))
	notes := slices.Clone(*n.notes) // Start has returned: no sender left
	ready := slices.Index(notes, "READY=1")
	if ready < 1 || !strings.HasPrefix(notes[0], "EXTEND_TIMEOUT_USEC=") {
		t.Fatalf("sd_notify during start %v: want EXTEND_TIMEOUT_USEC=... before READY=1", notes)
	}
	for _, s := range notes[ready:] {
		if strings.HasPrefix(s, "EXTEND_TIMEOUT_USEC=") {
			t.Fatalf("sd_notify %v: EXTEND_TIMEOUT_USEC after READY=1", notes)
		}
	}
	if want := "EXTEND_TIMEOUT_USEC=30000000"; notes[0] != want {
		t.Fatalf("first note %q, want %q", notes[0], want)
	}
}

// TestStartHugePagesUnreserved: --pool-hugepages=1G where none are free
// stops the start with the pool's clear error. What that error says
// depends on the host: a kernel that knows 1 GiB pages but has none
// reserved is told how to reserve them (nr_hugepages); one without them
// at all (many VMs: no hugepages-1048576kB) says they are not supported.
func TestStartHugePagesUnreserved(t *testing.T) {
	const dir = "/sys/kernel/mm/hugepages/hugepages-1048576kB"
	want := "nr_hugepages"
	switch b, err := os.ReadFile(dir + "/free_hugepages"); {
	case errors.Is(err, fs.ErrNotExist):
		want = "1G pages not supported here"
	case err != nil:
		t.Skipf("cannot read this host's 1 GiB page count: %v", err)
	case strings.TrimSpace(string(b)) != "0":
		t.Skip("this host has free 1 GiB pages")
	}
	cfg := testConfig(t)
	cfg.PoolHugePages = "1G"
	d, err := Start(context.Background(), cfg, WithLogger(zerolog.Nop()))
	if err == nil {
		d.Close()
		t.Fatal("start with unreserved 1G pages succeeded")
	}
	if !errors.Is(err, pool.ErrHugePages) || !strings.Contains(err.Error(), want) {
		t.Fatalf("start: %v, want pool.ErrHugePages saying %q", err, want)
	}
}
