package cluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/pegaflow/pegad/internal/config"
)

func TestMain(m *testing.M) {
	RunPegadIfChild()
	goleak.VerifyTestMain(m)
}

// Both runners give a node whose clients, stats and metrics work, and
// that stops clean at cleanup.
func TestRunners(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(testing.TB, ...Option) *Node
	}{
		{"in process", Start},
		{"process", StartProcess},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := tc.start(t, WithConfig(func(c *config.Config) { c.PoolSize = 8 << 20 }))
			if n.PeerAddr() == "" || n.MetricsAddr() == "" || n.Incarnation() == "" || n.Peer == nil {
				t.Fatalf("node %+v: addresses or clients missing", n)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c := n.Client(t)
			body := bytes.Repeat([]byte("kv"), 4096)
			if err := c.Put(ctx, "ns", []byte("h"), body); err != nil {
				t.Fatal(err)
			}
			got := make([]byte, len(body))
			if k, err := c.Get(ctx, "ns", []byte("h"), got); err != nil || k != len(body) || !bytes.Equal(got, body) {
				t.Fatalf("get: %d, %v", k, err)
			}
			if st := n.Stats(t); st.GetBlocks() != 1 || st.GetPoolSize() != 8<<20 || st.GetNodeId() != n.Name {
				t.Fatalf("stats: %v", st)
			}
			if m := n.Scrape(t); m["pegaflow_blocks"] != 1 {
				t.Fatalf("pegaflow_blocks = %v", m["pegaflow_blocks"])
			}
			if err := n.Stop(); err != nil {
				t.Fatalf("stop: %v\n%s", err, n.Logs)
			}
			if !strings.Contains(n.Logs.String(), "pegad ready") {
				t.Fatalf("logs lack the ready line:\n%s", n.Logs)
			}
		})
	}
}

// A killed process node is dead at once, and its socket refuses calls.
func TestKillProcess(t *testing.T) {
	n := StartProcess(t, Named("victim"))
	n.Kill(t)
	if dead, err := n.Exited(); !dead || err == nil {
		t.Fatalf("after Kill: exited %v, %v (want a signal exit)", dead, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := n.Admin.Stats(ctx, nil); err == nil {
		t.Fatal("a killed node answered Stats")
	}
	if err := n.Stop(); err != nil {
		t.Fatalf("Stop after Kill: %v", err)
	}
}

// A process node started InNetns runs in that namespace (not the test's)
// and serves its local clients through the socket file.
func TestProcessInNetns(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (ip netns)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("ip not found")
	}
	ns := fmt.Sprintf("pegad-cluster-test-%d", os.Getpid())
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	ip("-n", ns, "link", "set", "lo", "up")

	n := StartProcess(t, InNetns(ns), WithConfig(func(c *config.Config) { c.PoolSize = 8 << 20 }))
	self, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	child, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", n.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if child == self {
		t.Fatalf("process node's network namespace %s is the test's", child)
	}
	if st := n.Stats(t); st.GetNodeId() != n.Name {
		t.Fatalf("stats over the socket: %v", st)
	}
	if err := n.Stop(); err != nil {
		t.Fatalf("stop: %v\n%s", err, n.Logs)
	}
}

// WithArgs flags override the config file; a SIGTERM (Signal) ends the
// process with status 0 (WaitExit).
func TestProcessArgsAndSignal(t *testing.T) {
	n := StartProcess(t, Named("file-name"), WithArgs("--node-id", "flag-name"))
	if st := n.Stats(t); st.GetNodeId() != "flag-name" {
		t.Fatalf("node id %q, want the flag's", st.GetNodeId())
	}
	if exited, _ := n.WaitExit(t, 0); exited {
		t.Fatal("WaitExit says a running node exited")
	}
	n.Signal(t, syscall.SIGTERM)
	if exited, err := n.WaitExit(t, 30*time.Second); !exited || err != nil {
		t.Fatalf("after SIGTERM: exited %v, %v (want status 0)\n%s", exited, err, n.Logs)
	}
}
