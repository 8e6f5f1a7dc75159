package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDeps: pegactl is an operator's tool on the socket and the peer port;
// it must not pull in the daemon's config stack (viper) or its metrics
// (the Prometheus client), not even through a shared internal package.
func TestDeps(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Skipf("go list unavailable: %v: %s", err, out)
	}
	forbidden := []string{
		"github.com/spf13/viper",
		"github.com/prometheus/client_golang",
		"github.com/pegaflow/pegad/internal/config",
		"github.com/pegaflow/pegad/internal/metrics",
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range forbidden {
			if strings.HasPrefix(dep, f) {
				t.Errorf("cmd/pegactl depends on %s (forbidden prefix %s)", dep, f)
			}
		}
	}
}
