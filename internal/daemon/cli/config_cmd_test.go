package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestConfigCheck: the shipped example passes; a bad file lists every bad
// key and fails (exit 1 from Main).
func TestConfigCheck(t *testing.T) {
	out, err := run(t, "config", "check", filepath.Join("..", "..", "..", "configs", "pegad.yaml"))
	if err != nil || !strings.HasSuffix(strings.TrimSpace(out), ": ok") {
		t.Fatalf("configs/pegad.yaml: %q, %v", out, err)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("pool-size: lots\nqps-per-peer: 99\nlog-levl: debug\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = run(t, "config", "check", bad)
	if err == nil || !strings.Contains(err.Error(), "3 bad key(s)") || exitCode(err) != ExitError {
		t.Fatalf("bad file: err %v (exit %d), want exit 1", err, exitCode(err))
	}
	for _, key := range []string{"pool-size:", "qps-per-peer:", "log-levl: unknown key (did you mean log-level?)"} {
		if !strings.Contains(out, bad+": "+key) {
			t.Errorf("output lacks %q:\n%s", key, out)
		}
	}
}

// TestConfigPrint: flags of serve work on print, and each key says where
// its value came from.
func TestConfigPrint(t *testing.T) {
	t.Setenv("PEGAD_GC_INTERVAL", "3s")
	out, err := run(t, "config", "print", "--pool-size=1GiB")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"pool-size: 1GiB # flag --pool-size", "gc-interval: 3s # env PEGAD_GC_INTERVAL",
		"transport: auto # default"} {
		if !strings.Contains(out, want) {
			t.Errorf("config print lacks %q:\n%s", want, out)
		}
	}
	_, err = run(t, "config", "print", "--pool-size=lots")
	if err == nil || !strings.Contains(err.Error(), "pool-size") || exitCode(err) != ExitConfig {
		t.Fatalf("invalid flag value: %v (exit %d), want exit %d naming pool-size", err, exitCode(err), ExitConfig)
	}
}
