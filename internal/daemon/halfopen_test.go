package daemon_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"runtime"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/localdata"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// TestHalfOpenFloodIsBounded (issue 33): 1,000 connections to each of
// pegad's ports (peer and local gRPC, the data socket, metrics, debug)
// that send nothing, or only part of their protocol's first step, leave at
// most the per-source limit (64) of each waiting: the oldest are closed at
// once and counted, the goroutines they cost stay bounded, and real
// clients of every port work while the flood holds its connections. Before
// the fix all 5,000 stayed open until each server's own deadline (10 s to
// 120 s), a goroutine each.
func TestHalfOpenFloodIsBounded(t *testing.T) {
	const flood, perSource = 1000, 64
	n := cluster.Start(t, cluster.WithConfig(func(c *config.Config) { c.DebugListen = "127.0.0.1:0" }))
	// Let start-up goroutines settle before the baseline.
	time.Sleep(200 * time.Millisecond)
	base := runtime.NumGoroutine()

	h2 := "PRI * HTTP/2.0\r\n" // part of the HTTP/2 client preface
	ports := []struct{ port, network, addr, partial string }{
		{"peer", "tcp", n.PeerAddr(), h2},
		{"local", "unix", n.SocketPath(), h2},
		{"data", "unix", localdata.SocketPath(n.SocketPath()), "\x01\x00"},
		{"metrics", "tcp", n.MetricsAddr(), "GET /metrics HTTP/1.1\r\n"},
		{"debug", "tcp", n.Daemon().DebugAddr(), "GET /debug/pprof/ HTTP/1.1\r\nHost: x\r\n"},
	}
	for _, p := range ports {
		for i := 0; i < flood; i++ {
			c, err := net.DialTimeout(p.network, p.addr, 5*time.Second)
			if err != nil {
				t.Fatalf("%s: dial %d: %v", p.port, i, err)
			}
			defer c.Close()
			if i%2 == 1 {
				_, _ = c.Write([]byte(p.partial)) // may fail once evicted
			}
		}
	}

	// Bounded: per port at most 64 waiting (one source: 127.0.0.1, or this
	// uid), the rest closed and counted once accepted (the backlog drains
	// as the servers accept), a goroutine or two each, not one per
	// connection. The scrapes are a real metrics client during the flood.
	limit := base + len(ports)*perSource*2 + 100
	cluster.Eventually(t, "the flood evicted and goroutines bounded", 20*time.Second, func() error {
		if g := runtime.NumGoroutine(); g > limit {
			return fmt.Errorf("%d goroutines with %d half-open connections, want at most %d (baseline %d)",
				g, len(ports)*flood, limit, base)
		}
		m := n.Scrape(t)
		for _, p := range ports {
			k := fmt.Sprintf(`pegaflow_half_open_conns_refused_total{port=%q,reason="source_limit"}`, p.port)
			if got := m[k]; got < flood-perSource {
				return fmt.Errorf("%s = %v, want at least %d", k, got, flood-perSource)
			}
		}
		return nil
	})
	realClients(t, n)
}

// realClients use every port while a flood holds its connections.
func realClients(t *testing.T, n *cluster.Node) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, target := range []string{n.PeerAddr(), "unix://" + n.SocketPath()} {
		cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
			t.Errorf("health check on %s during the flood: %v", target, err)
		}
	}
	c := n.Client(t) // the data socket
	if err := c.Put(ctx, "flood", []byte("h1"), []byte("payload")); err != nil {
		t.Errorf("put through the data socket during the flood: %v", err)
	}
	buf := make([]byte, 16)
	if k, err := c.Get(ctx, "flood", []byte("h1"), buf); err != nil || string(buf[:k]) != "payload" {
		t.Errorf("get through the data socket during the flood: %q, %v", buf[:k], err)
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+n.Daemon().DebugAddr()+"/debug/pprof/", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("debug endpoint during the flood: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}
