package client_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/localdata"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/testutil"
)

// noGRPC is a gRPC connection that is never used: these tests only speak
// the data socket.
type noGRPC struct{}

func (noGRPC) Invoke(context.Context, string, any, any, ...grpc.CallOption) error {
	return errors.New("no gRPC here")
}

func (noGRPC) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, errors.New("no gRPC here")
}

// numaData serves a data socket over a pool split over nodes 0 and 1
// (testutil.FakeNUMA) and returns its path and pool.
func numaData(t *testing.T) (string, *pool.Pool) {
	t.Helper()
	p, err := pool.New(pool.Options{Size: 8 << 20, Log: zerolog.Nop(), Nodes: []int{0, 1}, Policy: &testutil.FakeNUMA{}})
	if err != nil {
		t.Fatal(err)
	}
	srv := localdata.New(localdata.Options{Store: store.New(p, nil), LeaseTimeout: time.Minute, Log: zerolog.Nop()})
	path := filepath.Join(testutil.ShortTempDir(t), "d.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
		_ = p.Close()
	})
	return path, p
}

// TestWithNUMANode: a client dialled with a NUMA node gets its blocks on
// that node's part of the pool; without one they spread as before.
func TestWithNUMANode(t *testing.T) {
	path, p := numaData(t)
	ctx := context.Background()
	dial := func(opts ...client.Option) *client.Client {
		c, err := client.Dial(ctx, "unused", append(opts, client.WithDataSocket(path), client.WithConn(noGRPC{}))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	parts, err := dial().PoolParts(ctx)
	if err != nil || len(parts) != 2 || parts[0] != (client.PoolPart{Node: 0, Off: 0, Len: 4 << 20}) ||
		parts[1] != (client.PoolPart{Node: 1, Off: 4 << 20, Len: 4 << 20}) {
		t.Fatalf("pool parts %+v, %v", parts, err)
	}
	for _, node := range []int{1, 0} {
		c := dial(client.WithNUMANode(node))
		var ws []*client.Writer
		for i := range 3 {
			w, err := c.Alloc(ctx, "ns", []byte{byte(node), byte(i)}, 64<<10)
			if err != nil {
				t.Fatal(err)
			}
			ws = append(ws, w)
		}
		// The daemon's pool says where the room was taken.
		for _, ps := range p.PartStats() {
			want := uint64(0)
			if ps.Node == node {
				want = 3 * 64 << 10
			}
			if ps.Used != want {
				t.Fatalf("node %d asked for: part on node %d has %d bytes used, want %d", node, ps.Node, ps.Used, want)
			}
		}
		for _, w := range ws {
			if err := w.Abort(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestWithNUMANodeRefusesBadNode: Dial refuses a node id no machine has.
func TestWithNUMANodeRefusesBadNode(t *testing.T) {
	path, _ := numaData(t)
	for _, node := range []int{-2, 1024} {
		c, err := client.Dial(context.Background(), "unused", client.WithNUMANode(node), client.WithDataSocket(path), client.WithConn(noGRPC{}))
		if !errors.Is(err, client.ErrInvalid) {
			if c != nil {
				_ = c.Close()
			}
			t.Fatalf("node %d: %v, want ErrInvalid", node, err)
		}
	}
}
