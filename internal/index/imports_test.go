package index_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImports keeps the index package backend-free: Redis stays behind
// the Index interface in redisindex, and neither the package nor the
// store it reads reaches the network through gRPC.
func TestImports(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Skipf("go list unavailable: %v: %s", err, out)
	}
	for _, dep := range strings.Fields(string(out)) {
		for _, f := range []string{"github.com/redis/", "google.golang.org/grpc", "github.com/pegaflow/pegad/internal/index/redisindex"} {
			if strings.HasPrefix(dep, f) {
				t.Errorf("internal/index depends on %s (forbidden prefix %s)", dep, f)
			}
		}
	}
}
