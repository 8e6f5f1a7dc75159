package daemon

import (
	"errors"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/config"
)

// TestPlanTCPData: the tcp data listener follows --listen and advertises a
// host peers on other hosts can dial; loopback on a cluster is refused,
// naming the flag that chose it.
func TestPlanTCPData(t *testing.T) {
	tests := []struct {
		name                      string
		listen, advertise, data   string
		wantHost, wantAdv, errHas string
		wantPort                  int
	}{
		{name: "single host default", listen: "127.0.0.1:50055", wantHost: "127.0.0.1", wantAdv: "127.0.0.1"},
		{name: "wildcard with advertise", listen: "0.0.0.0:50055", advertise: "node7.example:50055",
			wantHost: "0.0.0.0", wantAdv: "node7.example"},
		{name: "ipv6 wildcard with advertise", listen: "[::]:50055", advertise: "10.0.0.7:50055",
			wantHost: "::", wantAdv: "10.0.0.7"},
		{name: "concrete listen", listen: "10.0.0.7:50055", wantHost: "10.0.0.7", wantAdv: "10.0.0.7"},
		{name: "advertise wins over listen host", listen: "10.0.0.7:50055", advertise: "node7:50055",
			wantHost: "10.0.0.7", wantAdv: "node7"},
		{name: "explicit data host wins", listen: "0.0.0.0:50055", advertise: "node7:50055", data: "192.168.1.7:7400",
			wantHost: "192.168.1.7", wantAdv: "192.168.1.7", wantPort: 7400},
		{name: "explicit wildcard data takes advertise", listen: "0.0.0.0:50055", advertise: "node7:50055", data: "0.0.0.0:7400",
			wantHost: "0.0.0.0", wantAdv: "node7", wantPort: 7400},
		{name: "wildcard without advertise", listen: "0.0.0.0:50055", wantHost: "0.0.0.0", wantAdv: ""},
		{name: "old loopback data default on a cluster", listen: "0.0.0.0:50055", advertise: "node7:50055",
			data: "127.0.0.1:0", errHas: "--tcp-data-listen 127.0.0.1:0"},
		{name: "localhost data on a cluster", listen: "10.0.0.7:50055", data: "localhost:0", errHas: "--tcp-data-listen"},
		{name: "loopback advertise on a cluster", listen: "0.0.0.0:50055", advertise: "127.0.0.1:50055",
			errHas: "--advertise 127.0.0.1:50055"},
		{name: "loopback everything", listen: "127.0.0.1:50055", advertise: "localhost:50055", data: "127.0.0.1:0",
			wantHost: "127.0.0.1", wantAdv: "127.0.0.1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Listen, cfg.Advertise, cfg.TCPDataListen = tc.listen, tc.advertise, tc.data
			p, err := planTCPData(&cfg)
			if tc.errHas != "" {
				if !errors.Is(err, ErrLoopbackAdvertise) || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err = %v, want ErrLoopbackAdvertise naming %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.host != tc.wantHost || p.advertise != tc.wantAdv || p.port != tc.wantPort {
				t.Fatalf("plan = %+v, want host %q advertise %q port %d", p, tc.wantHost, tc.wantAdv, tc.wantPort)
			}
		})
	}
}

// TestStartRefusesLoopbackDataOnCluster: start-up fails before anything is
// served when the data listener would hand peers loopback.
func TestStartRefusesLoopbackDataOnCluster(t *testing.T) {
	cfg := config.Default()
	cfg.NodeID, cfg.Socket, cfg.MetricsListen = "n", t.TempDir()+"/s.sock", ""
	cfg.Transport, cfg.PoolSize = config.TransportTCP, 4<<20
	cfg.Listen, cfg.Advertise, cfg.TCPDataListen = "0.0.0.0:0", "192.0.2.7:50055", "127.0.0.1:0"
	d, err := Start(t.Context(), cfg, WithLogger(zerolog.Nop()), WithNotify(func(string) {}))
	if err == nil {
		_ = d.Close()
		t.Fatal("started with a loopback data listener on a cluster")
	}
	if !errors.Is(err, ErrLoopbackAdvertise) || !strings.Contains(err.Error(), "tcp-data-listen") {
		t.Fatalf("err = %v", err)
	}
}
