package tcp

import (
	"slices"
	"testing"

	"github.com/pegaflow/pegad/internal/metrics"
)

// TestRefusedReasonsStartAtZero: every reason this package counts is one
// metrics initialises at 0, so rate() works from the first scrape.
func TestRefusedReasonsStartAtZero(t *testing.T) {
	for _, r := range []string{refusedSourceLimit, refusedTotalLimit, refusedBadHello, refusedHelloWait, refusedRejected} {
		if !slices.Contains(metrics.TCPRefusedReasons, r) {
			t.Errorf("reason %q missing from metrics.TCPRefusedReasons", r)
		}
	}
}
