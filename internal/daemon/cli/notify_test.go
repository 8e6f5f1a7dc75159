package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// TestSystemdNotify re-executes the test binary as pegad through
// netns_test.go's TestMain (childArgsEnv).

// TestSystemdNotify runs pegad as systemd would (NOTIFY_SOCKET on a
// datagram socket, WATCHDOG_USEC set) and reads what it sends: READY=1
// only once the peer port, the local socket and /metrics answer, then
// WATCHDOG=1 pings, then STOPPING=1 on SIGTERM, and exit status 0.
func TestSystemdNotify(t *testing.T) {
	dir := t.TempDir()
	notifyPath := filepath.Join(dir, "notify")
	nl, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: notifyPath, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nl.Close() })
	msgs := make(chan string, 64)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := nl.Read(buf)
			if err != nil {
				close(msgs)
				return
			}
			for _, line := range strings.Split(strings.TrimSpace(string(buf[:n])), "\n") {
				msgs <- line
			}
		}
	}()

	socket := filepath.Join(dir, "pegad.sock")
	args := []string{"serve",
		"--listen=127.0.0.1:0", "--metrics-listen=127.0.0.1:0", "--socket=" + socket,
		"--transport=tcp", "--pool-size=4MiB", "--gc-interval=50ms", "--log-format=json",
		"--node-id=notify-test"}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childArgsEnv+"="+strings.Join(args, "\x1f"), "NOTIFY_SOCKET="+notifyPath,
		"WATCHDOG_USEC=200000", "PEGAD_CONFIG=")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	ready := make(chan map[string]any, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var line map[string]any
			if json.Unmarshal(sc.Bytes(), &line) == nil && line["message"] == "pegad ready" {
				ready <- line
			}
		}
		exited <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() }) // an error once it exited

	next := func(want string) {
		t.Helper()
		deadline := time.After(15 * time.Second)
		for {
			select {
			case m, ok := <-msgs:
				if !ok {
					t.Fatalf("notify socket closed before %s", want)
				}
				if m == want {
					return
				}
			case <-deadline:
				t.Fatalf("no %s from pegad", want)
			}
		}
	}

	next("READY=1")
	var line map[string]any
	select {
	case line = <-ready:
	case <-time.After(10 * time.Second):
		t.Fatal("no 'pegad ready' log line")
	}
	// Everything READY promised serves now.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, target := range []string{line["listen"].(string), "unix://" + socket} {
		cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		cc.Close()
		if err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("%s after READY=1: %v %v", target, r, err)
		}
	}
	resp, err := http.Get("http://" + line["metrics"].(string) + "/metrics")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics after READY=1: %v %v", resp, err)
	}
	resp.Body.Close()

	next("WATCHDOG=1")
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	next("STOPPING=1")
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("pegad exit after SIGTERM: %v, want status 0", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("pegad did not exit after SIGTERM")
	}
}
