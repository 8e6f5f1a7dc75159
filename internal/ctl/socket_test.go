package ctl

import (
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// childArgsEnv carries pegactl's arguments (unit-separated) to the test
// binary re-executed as another user.
const childArgsEnv = "PEGACTL_TEST_CHILD_ARGS"

func setSocketDefaults(t *testing.T, own, system string) {
	t.Helper()
	old := socketDefaults
	socketDefaults = func() (string, string) { return own, system }
	t.Cleanup(func() { socketDefaults = old })
	t.Setenv(EnvSocket, "")
}

// TestSocketFallback: a non-root pegactl whose own default socket is
// absent reaches the node's system socket without flags; its own socket,
// PEGACTL_SOCKET and --socket still win.
func TestSocketFallback(t *testing.T) {
	f := startFake(t) // plays the system pegad
	own := filepath.Join(t.TempDir(), "own.sock")
	setSocketDefaults(t, own, f.socket)

	if r := run(t, nil, "stats"); r.code != 0 {
		t.Fatalf("no fallback to the system socket: %+v", r)
	}
	// With the system socket gone too, the error names the user's own.
	setSocketDefaults(t, own, filepath.Join(t.TempDir(), "system.sock"))
	wantError(t, run(t, nil, "stats"), ExitUnavailable, "cannot reach pegad at "+own+": ")

	// The user's own pegad wins when its socket exists.
	mine := startFake(t)
	setSocketDefaults(t, mine.socket, f.socket)
	mine.mu.Lock()
	mine.stats.NodeId = "mine"
	mine.mu.Unlock()
	if r := run(t, nil, "-o", "json", "stats"); r.code != 0 || !strings.Contains(r.stdout, `"mine"`) {
		t.Fatalf("own socket not preferred: %+v", r)
	}
	// An explicit --socket is never replaced.
	setSocketDefaults(t, own, f.socket)
	wantError(t, run(t, nil, "--socket", own, "stats"), ExitUnavailable, "cannot reach pegad at "+own)
}

// TestRelativeSocket (issue 23): a relative --socket or PEGACTL_SOCKET is
// resolved against the working directory, so it reaches the daemon and an
// error names the absolute path that was tried.
func TestRelativeSocket(t *testing.T) {
	f := startFake(t)
	t.Chdir(filepath.Dir(f.socket))
	setSocketDefaults(t, filepath.Join(t.TempDir(), "own.sock"), filepath.Join(t.TempDir(), "system.sock"))
	if r := run(t, nil, "--socket", filepath.Base(f.socket), "stats"); r.code != 0 {
		t.Fatalf("relative --socket: %+v", r)
	}
	absent := filepath.Join(filepath.Dir(f.socket), "run", "absent.sock")
	wantError(t, run(t, nil, "--socket", filepath.Join("run", "absent.sock"), "stats"), ExitUnavailable,
		"cannot reach pegad at "+absent+": ")
	t.Setenv(EnvSocket, filepath.Join("run", "absent.sock"))
	wantError(t, run(t, nil, "stats"), ExitUnavailable, "cannot reach pegad at "+absent+": ")
}

func TestResolveSocket(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "present")
	if err := os.WriteFile(present, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	absent := filepath.Join(dir, "absent")
	tests := []struct{ own, system, want string }{
		{present, absent, present},
		{absent, present, present},
		{absent, absent, absent},
		{present, present, present},
	}
	for _, tc := range tests {
		if got := resolveSocket(tc.own, tc.system); got != tc.want {
			t.Errorf("resolveSocket(%s, %s) = %s, want %s", tc.own, tc.system, got, tc.want)
		}
	}
}

// TestSocketPermissionDenied: a user outside the socket's group is told
// so, with the group to join, under its own exit code (not "is pegad
// running?" and not the retryable 4). Runs pegactl as nobody.
func TestSocketPermissionDenied(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("SKIP: needs root to run pegactl as another user")
	}
	f := startFake(t)
	if err := os.Chmod(f.socket, 0o660); err != nil {
		t.Fatal(err)
	}
	// nobody must be able to reach the socket's directory and to run a
	// copy of this test binary.
	dir, err := os.MkdirTemp("", "pegactl-perm")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "pegactl.test")
	copyFile(t, os.Args[0], bin, 0o755)
	for _, d := range []string{dir, filepath.Dir(f.socket)} {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = []string{childArgsEnv + "=" + strings.Join([]string{"--socket", f.socket, "stats"}, "\x1f")}
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err = cmd.Run()
	code := cmd.ProcessState.ExitCode()
	wantError(t, ran{stderr: stderr.String(), code: code}, ExitPermission,
		"permission denied on pegad's socket "+f.socket+": join its group \"root\"")
	if t.Failed() {
		t.Logf("run as nobody: %v", err)
	}
}

func copyFile(t *testing.T, src, dst string, mode os.FileMode) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}
