package cluster

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/testutil"
)

// Start starts a node in this process: a loopback, tcp-transport pegad
// (testutil.LoopbackConfig) changed by opts. It is stopped at cleanup; a
// shutdown error there fails the test.
func Start(t testing.TB, opts ...Option) *Node {
	t.Helper()
	s, c := configFor(t, opts)
	logs := &testutil.LogBuffer{}
	level := zerolog.InfoLevel
	if s.verbose {
		level = zerolog.DebugLevel
	}
	dopts := append([]daemon.Option{
		daemon.WithLogger(zerolog.New(logs).Level(level).With().Timestamp().Logger()),
		daemon.WithNotify(func(string) {}),
	}, s.dopts...)
	d, err := daemon.Start(context.Background(), c, dopts...)
	if err != nil {
		t.Fatalf("start %s: %v\n%s", s.name, err, logs)
	}
	n := &Node{Name: s.name, Config: c, Logs: logs, d: d,
		socket: d.SocketPath(), peerAddr: d.PeerAddr(), metricsAddr: d.MetricsAddr(), incarnation: d.Incarnation()}
	t.Cleanup(func() {
		if err := n.Stop(); err != nil {
			t.Errorf("stop %s: %v", n.Name, err)
		}
	})
	n.connect(t)
	return n
}
