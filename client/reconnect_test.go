package client_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/testutil"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// restartable is a pegad on a fixed socket that a test restarts, as
// `systemctl restart pegad` does: the old daemon stops, a new one (an
// empty pool) listens on the same socket.
type restartable struct {
	t      *testing.T
	socket string
	node   *cluster.Node
}

func startRestartable(t *testing.T) *restartable {
	r := &restartable{t: t, socket: filepath.Join(testutil.ShortTempDir(t), "pegad.sock")}
	r.start()
	return r
}

func (r *restartable) start() {
	r.node = cluster.Start(r.t, cluster.WithConfig(func(c *config.Config) {
		c.Socket = r.socket
		c.MetricsListen = ""
	}))
}

func (r *restartable) restart() {
	if err := r.node.Stop(); err != nil {
		r.t.Fatalf("stop: %v", err)
	}
	r.start()
}

// TestNextCallAfterRestartWorks: a client dialled before the daemon
// restarted works on its next call, whichever call it is, with no new
// Dial (issue 33, item 8). Before, every call failed for good with
// "data connection broken by an earlier failure".
func TestNextCallAfterRestartWorks(t *testing.T) {
	ctx := context.Background()
	calls := []struct {
		name string
		call func(c *client.Client) error
	}{
		{"Put", func(c *client.Client) error { return c.Put(ctx, "ns", []byte("after"), pattern(5000, 3)) }},
		{"Get", func(c *client.Client) error {
			_, err := c.Get(ctx, "ns", []byte("missing"), make([]byte, 10))
			if errors.Is(err, client.ErrNotFound) {
				return nil // the new daemon's pool is empty
			}
			return err
		}},
		{"Alloc", func(c *client.Client) error {
			w, err := c.Alloc(ctx, "ns", []byte(t.Name()), 4096)
			if errors.Is(err, client.ErrExists) {
				return nil // the first call's block
			}
			if err != nil {
				return err
			}
			return w.Commit(ctx)
		}},
		{"Lookup", func(c *client.Client) error {
			n, err := c.Lookup(ctx, "ns", [][]byte{[]byte("before")})
			if err == nil && n != 0 {
				t.Errorf("Lookup found %d blocks in the new daemon's empty pool", n)
			}
			return err
		}},
		{"Delete", func(c *client.Client) error {
			if err := c.Delete(ctx, "ns", []byte("missing")); !errors.Is(err, client.ErrNotFound) {
				return err
			}
			return nil
		}},
	}
	for _, tc := range calls {
		t.Run(tc.name, func(t *testing.T) {
			r := startRestartable(t)
			c, err := client.Dial(ctx, r.socket)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if err := c.Put(ctx, "ns", []byte("before"), pattern(5000, 1)); err != nil {
				t.Fatal(err)
			}
			if err := c.Delete(ctx, "ns", []byte("before")); err != nil { // the gRPC channel is up
				t.Fatal(err)
			}
			r.restart()
			if err := tc.call(c); err != nil {
				t.Fatalf("first %s after the restart: %v", tc.name, err)
			}
			if err := tc.call(c); err != nil {
				t.Fatalf("second %s after the restart: %v", tc.name, err)
			}
			if got := client.Reconnects(c); tc.name != "Delete" && got != 1 {
				t.Fatalf("%d reconnects of the data socket, want 1", got)
			}
		})
	}
}

// TestLeasesEndWithTheirConnection: a Reader and a Writer taken before a
// restart fail after it, and their lease ids never reach the new
// connection, where the same ids name other leases.
func TestLeasesEndWithTheirConnection(t *testing.T) {
	ctx := context.Background()
	r := startRestartable(t)
	c, err := client.Dial(ctx, r.socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Put(ctx, "ns", []byte("k"), pattern(4096, 1)); err != nil {
		t.Fatal(err)
	}
	oldR, err := c.Lease(ctx, "ns", []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	oldW, err := c.Alloc(ctx, "ns", []byte("w"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	r.restart()

	// The new daemon numbers its leases afresh: the same shapes of calls
	// take the same ids as the old ones.
	if err := c.Put(ctx, "ns", []byte("k"), pattern(4096, 2)); err != nil {
		t.Fatalf("Put after the restart: %v", err)
	}
	newR, err := c.Lease(ctx, "ns", []byte("k"))
	if err != nil {
		t.Fatal(err)
	}
	newW, err := c.Alloc(ctx, "ns", []byte("w"), 4096)
	if err != nil {
		t.Fatal(err)
	}
	if err := oldW.Commit(ctx); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Commit of a writer of the old daemon: %v, want ErrUnavailable", err)
	}
	if err := c.ReleaseBatch([]*client.Reader{oldR}); !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("Release of a reader of the old daemon: %v, want ErrUnavailable", err)
	}
	st := r.node.Stats(t)
	if st.GetPinnedBlocks() != 1 {
		t.Fatalf("pinned blocks %d after the old reader's release, want 1 (the new reader's)", st.GetPinnedBlocks())
	}
	if n, err := c.Lookup(ctx, "ns", [][]byte{[]byte("w")}); err != nil || n != 0 {
		t.Fatalf("the old writer's commit stored a block on the new daemon: %d, %v", n, err)
	}
	if err := newW.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := newR.Release(); err != nil {
		t.Fatal(err)
	}
}

// TestEmptyPrefetchIsANoOp: the documented idiom Prefetch(hashes[Local:N])
// with nothing missing succeeds and fetches nothing (issue 33, item 9),
// through the client and through the daemon's own API.
func TestEmptyPrefetchIsANoOp(t *testing.T) {
	ctx := context.Background()
	n := startNode(t, nil)
	c := n.dial(t)
	tests := []struct {
		name   string
		hashes [][]byte
		opts   []client.PrefetchOption
	}{
		{"nil, from a peer", nil, []client.PrefetchOption{client.FromPeer(n.peer)}},
		{"empty, from a peer", [][]byte{}, []client.PrefetchOption{client.FromPeer(n.peer)}},
		{"nil, cluster index", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			res, err := c.Prefetch(ctx, "ns", tc.hashes, tc.opts...)
			if err != nil {
				t.Fatalf("empty Prefetch: %v, want success", err)
			}
			if res == nil || len(res.Blocks) != 0 || res.Bytes != 0 {
				t.Fatalf("empty Prefetch: %+v, want an empty result", res)
			}
		})
	}
}
