package bench

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/holder"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/testutil"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// TestMain: every daemon, server and stream a benchmark starts is stopped
// by its cleanup.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock accumulates the time of one side of a pair over the iterations.
type clock struct {
	total time.Duration
	n     int
}

// time runs f and adds its duration.
func (c *clock) time(f func()) {
	start := time.Now()
	f()
	c.total += time.Since(start)
	c.n++
}

// mbps is the rate of bytesPerOp per timed call, in MB/s (1e6 bytes).
func (c *clock) mbps(bytesPerOp int) float64 {
	if c.total <= 0 {
		return 0
	}
	return float64(c.n) * float64(bytesPerOp) / c.total.Seconds() / 1e6
}

// nsPerOp is the mean duration of one timed call.
func (c *clock) nsPerOp() float64 {
	if c.n == 0 {
		return 0
	}
	return float64(c.total.Nanoseconds()) / float64(c.n)
}

// reportRate reports subject and baseline rates (MB/s) and their ratio.
func reportRate(b *testing.B, subject, baseline string, s, base *clock, bytesPerOp int) {
	b.Helper()
	sv, bv := s.mbps(bytesPerOp), base.mbps(bytesPerOp)
	b.ReportMetric(sv, subject+"-MB/s")
	b.ReportMetric(bv, baseline+"-MB/s")
	if bv > 0 {
		b.ReportMetric(sv/bv, subject+"-ratio")
	}
}

// reportLatency reports subject and baseline per-op latencies (ns/op) and
// their ratio.
func reportLatency(b *testing.B, subject, baseline string, s, base *clock) {
	b.Helper()
	sv, bv := s.nsPerOp(), base.nsPerOp()
	b.ReportMetric(sv, subject+"-ns/op")
	b.ReportMetric(bv, baseline+"-ns/op")
	if bv > 0 {
		b.ReportMetric(sv/bv, subject+"-ratio")
	}
}

// newStreams is the plain-stream baseline: n tcp streams on 127.0.0.1, or
// one unix socket in a short temp dir.
func newStreams(b *testing.B, network string, n int) *testutil.Streams {
	b.Helper()
	addr := "127.0.0.1:0"
	if network == "unix" {
		addr = filepath.Join(shortTempDir(b), "raw.sock")
	}
	return testutil.NewStreams(b, network, addr, n)
}

// shortTempDir is a temporary directory with a short path: unix socket
// paths are limited to 108 bytes and b.TempDir embeds the benchmark name.
func shortTempDir(b *testing.B) string {
	b.Helper()
	dir, err := os.MkdirTemp("", "pegab")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// pattern is n bytes of a seed-dependent pattern (every page touched).
func pattern(n int, seed byte) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = seed + byte(i*7)
	}
	return p
}

// node is a daemon started in-process on loopback (tcp transport) with a
// client of its local API.
type node struct {
	d     *daemon.Daemon
	local pegadv1.LocalServiceClient
}

func startNode(b *testing.B, name string, poolSize config.ByteSize, opts ...func(*config.Config)) *node {
	b.Helper()
	n := cluster.Start(b, cluster.Named("bench-"+name), cluster.WithConfig(func(c *config.Config) {
		c.MetricsListen = ""
		c.PoolSize = poolSize
		c.GCInterval = config.Default().GCInterval
		for _, o := range opts {
			o(c)
		}
	}))
	return &node{d: n.Daemon(), local: n.Local}
}

// put stores body as a one-slot block, streamed in 1 MiB data messages
// (what pegactl and the connector send).
func (n *node) put(b *testing.B, ns string, hash, body []byte) {
	if _, err := testutil.PutBlock(context.Background(), n.local, ns, hash, body, false); err != nil {
		b.Fatal(err)
	}
}

// get reads a block back and returns how many data bytes arrived.
func (n *node) get(b *testing.B, ns string, hash []byte) int {
	body, err := testutil.GetBlock(context.Background(), n.local, ns, hash)
	if err != nil {
		b.Fatal(err)
	}
	return len(body)
}

func (n *node) delete(b *testing.B, ns string, hash []byte) {
	if _, err := n.local.DeleteBlock(context.Background(), &pegadv1.DeleteBlockRequest{Namespace: ns, Hash: hash}); err != nil {
		b.Fatal(err)
	}
}

// newHolder is holder.New with private metrics (o.Metrics nil), failing b
// on its error.
func newHolder(b *testing.B, o holder.Options) *holder.Service {
	b.Helper()
	if o.Metrics == nil {
		o.Metrics = metricstest.New()
	}
	svc, err := holder.New(o)
	if err != nil {
		b.Fatal(err)
	}
	return svc
}

// holderWithEcho serves a holder over st and a bare echo service on one
// gRPC server on 127.0.0.1:0 and returns the holder, one client connection
// to both and the echo's state: the lock benches compare the two through
// the same server and transport.
func holderWithEcho(b *testing.B, st *store.Store) (*holder.Service, *grpc.ClientConn, *echo) {
	b.Helper()
	svc := newHolder(b, holder.Options{Store: st, Log: zerolog.Nop(), NodeID: "bench-holder", Incarnation: "h1"})
	b.Cleanup(func() { svc.Locks().ReleaseAll("benchmark done") })
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(holder.RecoveryInterceptor(zerolog.Nop())))
	pegadv1.RegisterPeerServiceServer(srv, svc)
	e := &echo{}
	srv.RegisterService(&echoDesc, e)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	b.Cleanup(func() {
		srv.Stop()
		<-done
	})
	cc, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	return svc, cc, e
}
