// Package cluster starts pegad nodes for tests, the one way tests do: in
// process (daemon.Start) or as a real process of the pegad binary (to kill
// -9, or to run under another user, namespace or environment), both behind
// one Node with its local, admin and peer clients, its logs and a metrics
// scrape. Every node and client is stopped at the test's cleanup.
//
// It owns test nodes only. It must never be imported by non-test code, and
// it does not decide what a test checks: it starts, stops and connects.
package cluster

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/testutil"
)

// Node is one running pegad and clients of its sockets.
type Node struct {
	Name   string
	Config config.Config // as started (ephemeral ports as configured, e.g. 127.0.0.1:0); WithArgs flags not included
	Logs   *testutil.LogBuffer

	LocalConn *grpc.ClientConn // the local socket: Local, Admin, Cluster, Health services
	Local     pegadv1.LocalServiceClient
	Admin     pegadv1.AdminServiceClient
	PeerConn  *grpc.ClientConn          // the peer port, plaintext; nil with peer TLS
	Peer      pegadv1.PeerServiceClient // on PeerConn; nil with peer TLS

	socket, peerAddr, metricsAddr, incarnation string

	d    *daemon.Daemon // in process; nil for a process node
	proc *process       // process node; nil in process

	conns    []*grpc.ClientConn
	stopOnce sync.Once
	stopErr  error
}

// Option changes how a node starts.
type Option func(*spec)

type spec struct {
	name    string
	mutate  []func(*config.Config)
	dopts   []daemon.Option
	env     []string
	netns   string
	args    []string
	verbose bool
}

// Named sets the node's id (default: a unique "node-N").
func Named(name string) Option { return func(s *spec) { s.name = name } }

// WithConfig changes the loopback config before start (pool size, lock
// timeout, cluster index, TLS files, ...).
func WithConfig(f func(*config.Config)) Option {
	return func(s *spec) { s.mutate = append(s.mutate, f) }
}

// WithDaemonOptions passes options to daemon.Start (in-process nodes only:
// test hooks such as fault injection).
func WithDaemonOptions(o ...daemon.Option) Option {
	return func(s *spec) { s.dopts = append(s.dopts, o...) }
}

// WithEnv adds KEY=VALUE pairs to a process node's environment.
func WithEnv(kv ...string) Option { return func(s *spec) { s.env = append(s.env, kv...) } }

// WithArgs adds flags to a process node's command line, after its config
// file, so they override it (Node.Config is the file's).
func WithArgs(flags ...string) Option { return func(s *spec) { s.args = append(s.args, flags...) } }

// InNetns runs a process node in the network namespace name (it must exist,
// with its loopback up).
func InNetns(name string) Option { return func(s *spec) { s.netns = name } }

// DebugLogs keeps debug-level lines in Logs (default: info and above).
func DebugLogs() Option { return func(s *spec) { s.verbose = true } }

var seq atomic.Int64

// configFor builds the node's config: testutil.LoopbackConfig with the
// socket in a short temp dir (unix socket paths are limited to 108 bytes).
func configFor(t testing.TB, opts []Option) (spec, config.Config) {
	t.Helper()
	s := spec{name: fmt.Sprintf("node-%d", seq.Add(1))}
	for _, o := range opts {
		o(&s)
	}
	c := testutil.LoopbackConfig(s.name, filepath.Join(testutil.ShortTempDir(t), "pegad.sock"))
	for _, f := range s.mutate {
		f(&c)
	}
	return s, c
}

// connect dials the node's local socket and, when known, its peer port.
func (n *Node) connect(t testing.TB) {
	t.Helper()
	lc := n.dial(t, "unix://"+n.socket)
	n.LocalConn = lc
	n.Local, n.Admin = pegadv1.NewLocalServiceClient(lc), pegadv1.NewAdminServiceClient(lc)
	if n.peerAddr != "" && !n.Config.PeerTLS() {
		n.PeerConn = n.dial(t, n.peerAddr)
		n.Peer = pegadv1.NewPeerServiceClient(n.PeerConn)
	}
}

func (n *Node) dial(t testing.TB, target string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("%s: dial %s: %v", n.Name, target, err)
	}
	n.conns = append(n.conns, cc)
	return cc
}

// SocketPath is the local API socket (the data socket is it + ".data").
func (n *Node) SocketPath() string { return n.socket }

// PeerAddr is the bound peer address (host:port).
func (n *Node) PeerAddr() string { return n.peerAddr }

// MetricsAddr is the bound metrics address ("" when disabled).
func (n *Node) MetricsAddr() string { return n.metricsAddr }

// Incarnation is the running daemon's incarnation id.
func (n *Node) Incarnation() string { return n.incarnation }

// Daemon is the in-process daemon (nil for a process node).
func (n *Node) Daemon() *daemon.Daemon { return n.d }

// Client dials the public client (zero-copy data socket), closed at
// cleanup.
func (n *Node) Client(t testing.TB, opts ...pegaclient.Option) *pegaclient.Client {
	t.Helper()
	c, err := pegaclient.Dial(context.Background(), n.socket, opts...)
	if err != nil {
		t.Fatalf("%s: client: %v", n.Name, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Scrape reads the node's /metrics as "name{labels}" → value.
func (n *Node) Scrape(t testing.TB) map[string]float64 {
	t.Helper()
	if n.metricsAddr == "" {
		t.Fatalf("%s: metrics are disabled", n.Name)
	}
	return Scrape(t, n.metricsAddr)
}

// Stats is the admin Stats answer.
func (n *Node) Stats(t testing.TB) *pegadv1.StatsResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := n.Admin.Stats(ctx, &pegadv1.StatsRequest{})
	if err != nil {
		t.Fatalf("%s: stats: %v", n.Name, err)
	}
	return st
}

// Stop shuts the node down gracefully (SIGTERM for a process) and closes
// its clients; it returns the shutdown's error. Idempotent; cleanup calls it.
func (n *Node) Stop() error {
	n.stopOnce.Do(func() {
		for _, cc := range n.conns {
			_ = cc.Close()
		}
		if n.d != nil {
			n.stopErr = n.d.Close()
		} else {
			n.stopErr = n.proc.stop()
		}
	})
	return n.stopErr
}

// Eventually polls f every 20 ms until it returns nil or d passes.
func Eventually(t testing.TB, what string, d time.Duration, f func() error) {
	t.Helper()
	end := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
