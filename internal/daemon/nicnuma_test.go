package daemon

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
)

// TestNICNUMA: nic-numa sets the NUMA node of the named NICs (tcp devices
// here, the same path as verbs' Options.NUMANodes), a NIC left without one
// is named in a warning on a multi-node host, and a nic-numa naming a NIC
// pegad did not open is refused (issue 27, finding b).
func TestNICNUMA(t *testing.T) {
	old := hostNUMANodes
	hostNUMANodes = func() int { return 2 }
	t.Cleanup(func() { hostNUMANodes = old })
	tests := []struct {
		name     string
		nics     string
		nicNUMA  string
		want     map[string]int // NUMANode per device
		logHas   []string
		errHas   string
		noLogHas string
	}{
		{name: "named", nics: "2", nicNUMA: "tcp0=0,tcp1=1", want: map[string]int{"tcp0": 0, "tcp1": 1},
			logHas:   []string{`"nic":"tcp0","numa_node":0,"message":"NIC NUMA node named by nic-numa"`, `"nic":"tcp1","numa_node":1`},
			noLogHas: "has no NUMA node"},
		{name: "one unnamed", nics: "rxe0,rxe1", nicNUMA: "rxe1=1", want: map[string]int{"rxe0": -1, "rxe1": 1},
			logHas: []string{`"level":"warn","nic":"rxe0","host_numa_nodes":2,"message":"NIC has no NUMA node`}},
		{name: "none named", nics: "1", want: map[string]int{"tcp0": -1},
			logHas: []string{`"level":"warn","nic":"tcp0"`, "--nic-numa NIC=NODE"}},
		{name: "names a NIC not opened", nics: "2", nicNUMA: "rxe9=0", errHas: "nic-numa names rxe9"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Transport, cfg.NICs, cfg.NICNUMA = config.TransportTCP, tc.nics, tc.nicNUMA
			cfg.TCPDataListen = "127.0.0.1:0"
			var buf bytes.Buffer
			log := zerolog.New(&buf)
			tr, err := openTransport(&cfg, metricstest.New(), log)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(tr.close)
			err = checkNICNUMA(&cfg, tr.devices, log)
			if tc.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tc.errHas) {
					t.Fatalf("err = %v, want one naming %q", err, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range tr.devices {
				in := d.Info()
				if want, ok := tc.want[in.Name]; !ok || in.NUMANode != want {
					t.Errorf("%s: NUMANode %d, want %d (listed: %v)", in.Name, in.NUMANode, want, ok)
				}
			}
			for _, s := range tc.logHas {
				if !strings.Contains(buf.String(), s) {
					t.Errorf("log lacks %q:\n%s", s, buf.String())
				}
			}
			if tc.noLogHas != "" && strings.Contains(buf.String(), tc.noLogHas) {
				t.Errorf("log has %q:\n%s", tc.noLogHas, buf.String())
			}
		})
	}
}
