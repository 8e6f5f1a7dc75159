package cli_test

import (
	"context"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// TestSystemdNotify re-executes the test binary as pegad
// (cluster.StartProcess, through netns_test.go's TestMain).

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

	n := cluster.StartProcess(t, cluster.Named("notify-test"), cluster.WithConfig(func(c *config.Config) {
		c.PoolSize = 4 << 20
	}), cluster.WithEnv("NOTIFY_SOCKET="+notifyPath, "WATCHDOG_USEC=200000"))

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

	next("READY=1") // StartProcess saw the "pegad ready" log line
	// Everything READY promised serves now.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, target := range []string{n.PeerAddr(), "unix://" + n.SocketPath()} {
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
	resp, err := http.Get("http://" + n.MetricsAddr() + "/metrics")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics after READY=1: %v %v", resp, err)
	}
	resp.Body.Close()

	next("WATCHDOG=1")
	n.Signal(t, syscall.SIGTERM)
	next("STOPPING=1")
	switch exited, err := n.WaitExit(t, 15*time.Second); {
	case !exited:
		t.Fatal("pegad did not exit after SIGTERM")
	case err != nil:
		t.Fatalf("pegad exit after SIGTERM: %v, want status 0", err)
	}
}
