package conn

import (
	"slices"
	"testing"

	"github.com/pegaflow/pegad/internal/metrics"
)

// TestReapReasonsStartAtZero: every reap reason is initialised at 0.
func TestReapReasonsStartAtZero(t *testing.T) {
	for _, r := range []string{reapIdle, reapDrained} {
		if !slices.Contains(metrics.ReapReasons, r) {
			t.Errorf("reason %q missing from metrics.ReapReasons", r)
		}
	}
}
