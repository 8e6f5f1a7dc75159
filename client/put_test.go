package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/api/localwire"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/localdata"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestPutRoundTrips: a Put copies into the room reserved by the previous
// one and commits it with one PUT that reserves the next (one round trip);
// the first Put, a Put of another size and a Put after the spare grew too
// old reserve first.
func TestPutRoundTrips(t *testing.T) {
	n := startNode(t, func(c *config.Config) {
		c.LockTimeout = time.Second
		c.GCInterval = 20 * time.Millisecond
	})
	c := n.dial(t)
	if v := client.ProtocolVersion(c); v != localwire.Version {
		t.Fatalf("protocol version %d, want %d", v, localwire.Version)
	}
	ctx := context.Background()
	steps := []struct {
		name  string
		size  int
		sleep time.Duration
		trips uint32
	}{
		{"first: reserve, put", 5000, 0, 2},
		{"same size: put", 5000, 0, 1},
		{"again: put", 5000, 0, 1},
		{"other size: abort, reserve, put", 7000, 0, 3},
		{"spare older than half the lease timeout: abort, reserve, put", 7000, 600 * time.Millisecond, 3},
		{"spare expired: abort (no lease), reserve, put", 7000, 1200 * time.Millisecond, 3},
	}
	for i, s := range steps {
		time.Sleep(s.sleep)
		before := client.RoundTrips(c)
		data := pattern(s.size, byte(i))
		hash := fmt.Appendf(nil, "h%d", i)
		var created bool
		if err := c.Put(ctx, "ns", hash, data, client.WasCreated(&created)); err != nil || !created {
			t.Fatalf("%s: Put: %v, created %v", s.name, err, created)
		}
		if got := client.RoundTrips(c) - before; got != s.trips {
			t.Fatalf("%s: %d round trips, want %d", s.name, got, s.trips)
		}
		dst := make([]byte, s.size)
		if got, err := c.Get(ctx, "ns", hash, dst); err != nil || got != s.size || !bytes.Equal(dst, data) {
			t.Fatalf("%s: Get = %d, %v, equal %v", s.name, got, err, bytes.Equal(dst, data))
		}
	}
}

// TestPutSpare: what a Put leaves reserved is room for the next Put and
// nothing else: an existing key drops the copy, a refused key keeps the
// spare for the next Put, concurrent Puts on one client each get their
// block stored, and Close gives the spare back before it returns.
func TestPutSpare(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t)
	ctx := context.Background()
	const size = 4096
	var created bool
	if err := c.Put(ctx, "ns", []byte("a"), pattern(size, 1), client.WasCreated(&created)); err != nil || !created {
		t.Fatalf("Put: %v, created %v", err, created)
	}
	if used := n.stats(t).GetPoolUsed(); used != 2*size {
		t.Fatalf("pool used %d after a Put, want the block and a spare of %d", used, size)
	}
	if err := c.Put(ctx, "ns", []byte("a"), pattern(size, 2), client.WasCreated(&created)); err != nil || created {
		t.Fatalf("Put of a stored key: %v, created %v", err, created)
	}
	before := client.RoundTrips(c)
	if err := c.Put(ctx, "", []byte("b"), pattern(size, 3)); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("Put with an empty namespace: %v, want ErrInvalid", err)
	}
	if err := c.Put(ctx, "ns", []byte("b"), pattern(size, 3)); err != nil {
		t.Fatal(err)
	}
	if got := client.RoundTrips(c) - before; got != 2 {
		t.Fatalf("%d round trips for a refused and a good Put, want 2 (the spare survives the refusal)", got)
	}
	// A Put of another size the pool cannot hold changes nothing either:
	// the spare stays for the next Put of its size.
	used := n.stats(t).GetPoolUsed()
	if err := c.Put(ctx, "ns", []byte("huge"), make([]byte, 64<<20)); !errors.Is(err, client.ErrPoolFull) {
		t.Fatalf("Put larger than the pool: %v, want ErrPoolFull", err)
	}
	if after := n.stats(t).GetPoolUsed(); after != used {
		t.Fatalf("pool used %d after a refused Put, %d before", after, used)
	}
	before = client.RoundTrips(c)
	if err := c.Put(ctx, "ns", []byte("c"), pattern(size, 4)); err != nil {
		t.Fatal(err)
	}
	if got := client.RoundTrips(c) - before; got != 1 {
		t.Fatalf("%d round trips after a refused Put of another size, want 1", got)
	}
	// A Put whose context is already done sends nothing and keeps the
	// spare (it was lost until the connection closed, before).
	done, cancel := context.WithCancel(ctx)
	cancel()
	used = n.stats(t).GetPoolUsed()
	if err := c.Put(done, "ns", []byte("late"), pattern(size, 5)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with a cancelled context: %v", err)
	}
	before = client.RoundTrips(c)
	if err := c.Put(ctx, "ns", []byte("d"), pattern(size, 6)); err != nil {
		t.Fatal(err)
	}
	if got, after := client.RoundTrips(c)-before, n.stats(t).GetPoolUsed(); got != 1 || after != used+size {
		t.Fatalf("after a cancelled Put: %d round trips (want 1), pool used %d (want %d)", got, after, used+size)
	}
	dst := make([]byte, size)
	if _, err := c.Get(ctx, "ns", []byte("a"), dst); err != nil || !bytes.Equal(dst, pattern(size, 1)) {
		t.Fatalf("block a: %v, the first Put's bytes %v", err, bytes.Equal(dst, pattern(size, 1)))
	}
	if used := n.stats(t).GetPoolUsed(); used != 5*size {
		t.Fatalf("pool used %d, want blocks a, b, c, d and one spare", used)
	}

	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 4 {
		wg.Go(func() {
			for i := range 16 {
				data := pattern(size, byte(g*16+i))
				if err := c.Put(ctx, "conc", fmt.Appendf(nil, "%d-%d", g, i), data); err != nil {
					errs <- err
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for g := range 4 {
		for i := range 16 {
			if _, err := c.Get(ctx, "conc", fmt.Appendf(nil, "%d-%d", g, i), dst); err != nil || !bytes.Equal(dst, pattern(size, byte(g*16+i))) {
				t.Fatalf("block %d-%d: %v", g, i, err)
			}
		}
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	// Close gave the spare back before it returned: no wait.
	if st := n.stats(t); st.GetPoolUsed() != (4+64)*size || st.GetBlocks() != 68 {
		t.Fatalf("right after Close: %+v, want %d used by %d blocks", st, (4+64)*size, 68)
	}
}

// TestPutToVersion1Daemon: against a daemon that speaks only version 1 the
// client dials again with it and Put takes ALLOC and COMMIT.
func TestPutToVersion1Daemon(t *testing.T) {
	p, err := pool.New(pool.Options{Size: 1 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	st := store.New(p, nil)
	srv := localdata.New(localdata.Options{Store: st, LeaseTimeout: time.Minute, MaxVersion: 1, Log: zerolog.Nop()})
	dir := testutil.ShortTempDir(t)
	l, err := net.Listen("unix", filepath.Join(dir, "p.sock.data"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		_ = srv.Close()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
		_ = p.Close()
	})
	// Only the data socket is served: the gRPC one is never dialled here.
	c, err := client.Dial(context.Background(), filepath.Join(dir, "p.sock"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if v := client.ProtocolVersion(c); v != 1 {
		t.Fatalf("protocol version %d, want 1", v)
	}
	ctx := context.Background()
	for i := range 3 {
		before := client.RoundTrips(c)
		data := pattern(5000, byte(i))
		if err := c.Put(ctx, "ns", fmt.Appendf(nil, "h%d", i), data); err != nil {
			t.Fatal(err)
		}
		if got := client.RoundTrips(c) - before; got != 2 {
			t.Fatalf("Put %d: %d round trips, want 2 (alloc, commit)", i, got)
		}
		dst := make([]byte, len(data))
		if _, err := c.Get(ctx, "ns", fmt.Appendf(nil, "h%d", i), dst); err != nil || !bytes.Equal(dst, data) {
			t.Fatalf("Get %d: %v", i, err)
		}
	}
	if s := st.Stats(); s.Blocks != 3 || s.Pool.Used != 3*5056 {
		t.Fatalf("store %+v", s)
	}
}

// TestPrefetchWithoutPeer: without FromPeer the daemon finds the holder in
// the cluster index (before, the client refused the call itself); a
// daemon without an index answers ErrNoIndex.
func TestPrefetchWithoutPeer(t *testing.T) {
	ctx := context.Background()
	standalone := startNode(t, nil).dial(t)
	if _, err := standalone.Prefetch(ctx, "ns", [][]byte{[]byte("x")}); !errors.Is(err, client.ErrNoIndex) {
		t.Fatalf("Prefetch without a peer on a standalone daemon: %v, want ErrNoIndex", err)
	}

	r := testutil.StartRedis(t)
	withIndex := func(c *config.Config) {
		c.ClusterRedis = r.URL()
		c.ClusterTTL = time.Second
	}
	a, b := startNode(t, withIndex), startNode(t, withIndex)
	ca, cb := a.dial(t), b.dial(t)
	data := pattern(1<<20, 3)
	if err := ca.Put(ctx, "ns", []byte("c1"), data); err != nil {
		t.Fatal(err)
	}
	// The holder publishes its blocks to the index asynchronously.
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := cb.Prefetch(ctx, "ns", [][]byte{[]byte("c1")}, client.WithPrefetchTimeout(10*time.Second))
		if err == nil && res.Blocks[0].Status == pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED {
			if res.Bytes != 1<<20 {
				t.Fatalf("prefetched %d bytes, want %d", res.Bytes, 1<<20)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prefetch without a peer never fetched the block: %+v, %v", res, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	dst := make([]byte, len(data))
	if n, err := cb.Get(ctx, "ns", []byte("c1"), dst); err != nil || n != len(data) || !bytes.Equal(dst, data) {
		t.Fatalf("Get of the block prefetched through the index: %d, %v", n, err)
	}
}
