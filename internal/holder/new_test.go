package holder

import (
	"errors"
	"testing"

	"github.com/rs/zerolog"
)

// TestNewRequiresMetrics: metrics are a required option; New does not
// make a private registry the daemon would never serve.
func TestNewRequiresMetrics(t *testing.T) {
	s, err := New(Options{Store: newFakePinner(), Log: zerolog.Nop()})
	if !errors.Is(err, ErrNoMetrics) || s != nil {
		t.Fatalf("New without Metrics: %v, %v; want ErrNoMetrics", s, err)
	}
}
