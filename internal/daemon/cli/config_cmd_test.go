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

// TestBadConfigRefusedAlike: a config file `pegad config check` refuses,
// serve refuses too with exit 78 (one validation, peertls's own for the
// TLS and allow-list keys); and what only a start can find out — TLS
// files that do not load, a socket group that does not exist — exits 78
// as well, not 1, though config check (which reads no other file) passes it.
func TestBadConfigRefusedAlike(t *testing.T) {
	tls := "peer-tls-cert: c.pem\npeer-tls-key: k.pem\npeer-tls-ca: ca.pem\n"
	tests := []struct {
		name      string
		yaml      string
		checkKey  string // "" when config check passes the file
		serveWant string // in serve's error
	}{
		{"allow-list over peertls's cap", tls + "peer-allow: \"" + strings.Repeat("n,", 1024) + "n\"\n", "peer-allow", "at most 1024"},
		{"allow-list empty entry", tls + "peer-allow: a,,b\n", "peer-allow", "empty entry"},
		{"allow-list without TLS", "peer-allow: node-a\n", "peer-allow", "needs peer-tls"},
		{"partial TLS files", "peer-tls-cert: c.pem\n", "peer-tls-cert", "all three"},
		{"value out of range", "qps-per-peer: 99\n", "qps-per-peer", "qps-per-peer"},
		{"unknown key", "log-levl: debug\n", "log-levl", "log-levl: unknown key (did you mean log-level?)"},
		{"TLS files that do not load", "peer-tls-cert: /nonexistent/c.pem\npeer-tls-key: /nonexistent/k.pem\npeer-tls-ca: /nonexistent/ca.pem\n", "", "bad peer TLS files"},
		{"socket group that does not exist", "socket-group: pegad-review-no-such-group\n", "", "no-such-group"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			file := filepath.Join(t.TempDir(), "pegad.yaml")
			if err := os.WriteFile(file, []byte(tc.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			out, err := run(t, "config", "check", file)
			switch {
			case tc.checkKey == "" && err != nil:
				t.Fatalf("config check: %v\n%s", err, out)
			case tc.checkKey != "" && (err == nil || exitCode(err) != ExitError || !strings.Contains(out, file+": "+tc.checkKey+":")):
				t.Fatalf("config check: %v (exit %d), want exit 1 naming %s:\n%s", err, exitCode(err), tc.checkKey, out)
			}
			_, err = run(t, "serve", "--config", file, "--socket", filepath.Join(t.TempDir(), "s.sock"),
				"--listen", "127.0.0.1:0", "--metrics-listen", "", "--pool-size", "4MiB", "--transport", "tcp")
			if err == nil || exitCode(err) != ExitConfig || !strings.Contains(err.Error(), tc.serveWant) {
				t.Fatalf("serve: %v (exit %d), want exit %d naming %q", err, exitCode(err), ExitConfig, tc.serveWant)
			}
		})
	}
}
