//go:build !linux || !cgo || noverbs

package verbs

import (
	"errors"
	"strings"
	"testing"

	"github.com/pegaflow/pegad/internal/ibv"
)

func TestStubUnavailable(t *testing.T) {
	if _, err := New().Devices(); !errors.Is(err, ibv.ErrUnavailable) || !strings.Contains(err.Error(), "built without cgo") {
		t.Fatalf("Devices: %v", err)
	}
	if d, err := New().Open("mlx5_0"); d != nil || !errors.Is(err, ibv.ErrUnavailable) {
		t.Fatalf("Open: %v, %v", d, err)
	}
	if ok, why := Available(); ok || !strings.HasPrefix(why, "verbs unavailable: built without cgo") {
		t.Fatalf("Available: %v %q", ok, why)
	}
}
