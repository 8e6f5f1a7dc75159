package client_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

func TestMain(m *testing.M) {
	if helperMain() {
		return
	}
	goleak.VerifyTestMain(m)
}

// node is an in-process pegad and an admin client of it.
type node struct {
	socket string
	peer   string // the peer gRPC address
	admin  pegadv1.AdminServiceClient
}

// nodeSeq names nodes apart (a holder tells requesters by node id).
var nodeSeq atomic.Int64

func startNode(t testing.TB, mutate func(*config.Config)) *node {
	t.Helper()
	n := cluster.Start(t, cluster.Named(fmt.Sprintf("client-test-%d", nodeSeq.Add(1))), cluster.WithConfig(func(c *config.Config) {
		c.MetricsListen = ""
		if mutate != nil {
			mutate(c)
		}
	}))
	return &node{socket: n.SocketPath(), peer: n.PeerAddr(), admin: n.Admin}
}

func (n *node) dial(t testing.TB, opts ...client.Option) *client.Client {
	t.Helper()
	c, err := client.Dial(context.Background(), n.socket, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (n *node) stats(t testing.TB) *pegadv1.StatsResponse {
	t.Helper()
	st, err := n.admin.Stats(context.Background(), &pegadv1.StatsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// waitStats polls the daemon's stats until ok accepts them (5 s).
func (n *node) waitStats(t testing.TB, what string, ok func(*pegadv1.StatsResponse) bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		st := n.stats(t)
		if ok(st) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: stats stayed %+v", what, st)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// blockBytes is what a block of n bytes takes in the pool (its alignment).
func blockBytes(n int) uint64 { return uint64(n+63) &^ 63 }
