package daemon

import (
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/ibv"
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
		a := connectAttr(tc.transport)
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
