package client_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/testutil"
)

// chain is n distinct hashes.
func chain(n int) [][]byte {
	hs := make([][]byte, n)
	for i := range hs {
		hs[i] = []byte(fmt.Sprintf("h%05d", i))
	}
	return hs
}

func putChain(t *testing.T, c *client.Client, ns string, hs [][]byte) {
	t.Helper()
	for i, h := range hs {
		if err := c.Put(context.Background(), ns, h, pattern(256, byte(i))); err != nil {
			t.Fatal(err)
		}
	}
}

// TestLookup: the stored prefix's length, per rank namespace, with gaps,
// over chains longer than one round trip; nothing pinned.
func TestLookup(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t)
	ctx := context.Background()
	hs := chain(5000)
	putChain(t, c, "m@tp0", hs[:4500])
	putChain(t, c, "m@tp1", hs[:3])
	putChain(t, c, "m@tp1", hs[4:6]) // a gap at 3
	tests := []struct {
		ns   string
		hs   [][]byte
		want int
	}{
		{"m@tp0", hs, 4500},
		{"m@tp0", hs[:4096], 4096},
		{"m@tp0", hs[:10], 10},
		{"m@tp1", hs[:10], 3},
		{"m@tp1", hs[4:10], 2},
		{"m@tp2", hs[:10], 0},
		{"m@tp0", nil, 0},
	}
	for _, tc := range tests {
		got, err := c.Lookup(ctx, tc.ns, tc.hs)
		if err != nil || got != tc.want {
			t.Errorf("Lookup(%s, %d hashes) = %d, %v; want %d", tc.ns, len(tc.hs), got, err, tc.want)
		}
	}
	// min over ranks: the prefix every rank can load.
	if r0, r1 := mustLookup(t, c, "m@tp0", hs[:10]), mustLookup(t, c, "m@tp1", hs[:10]); min(r0, r1) != 3 {
		t.Errorf("min over ranks %d, want 3", min(r0, r1))
	}
	if st := n.stats(t); st.GetPinnedBlocks() != 0 {
		t.Errorf("lookups pinned %d blocks", st.GetPinnedBlocks())
	}
	if _, err := c.Lookup(ctx, "", hs[:1]); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("Lookup with an empty namespace: %v, want ErrInvalid", err)
	}
}

func mustLookup(t *testing.T, c *client.Client, ns string, hs [][]byte) int {
	t.Helper()
	n, err := c.Lookup(context.Background(), ns, hs)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLookupPinAdopt: a pin made on one connection is adopted by another
// (same user), which reads the blocks; a second adopt, an unknown token,
// and a release after adopt are refused and change nothing.
func TestLookupPinAdopt(t *testing.T) {
	n := startNode(t, nil)
	sched, worker := n.dial(t), n.dial(t)
	ctx := context.Background()
	hs := chain(8)
	putChain(t, sched, "ns", hs[:5])
	pin, err := sched.LookupPin(ctx, "ns", hs)
	if err != nil || pin.N != 5 || len(pin.Token) == 0 {
		t.Fatalf("LookupPin = %+v, %v; want 5 blocks", pin, err)
	}
	if st := n.stats(t); st.GetPinnedBlocks() != 5 {
		t.Fatalf("pinned %d, want 5", st.GetPinnedBlocks())
	}
	bad := append([]byte(nil), pin.Token...)
	bad[len(bad)-1] ^= 1
	for name, tok := range map[string][]byte{"forged": bad, "short": pin.Token[:4], "empty": nil} {
		if _, err := worker.Adopt(ctx, tok); !errors.Is(err, client.ErrNotFound) {
			t.Errorf("Adopt of a %s token: %v, want ErrNotFound", name, err)
		}
	}
	rs, err := worker.Adopt(ctx, pin.Token)
	if err != nil || len(rs) != 5 {
		t.Fatalf("Adopt = %d readers, %v", len(rs), err)
	}
	for i, r := range rs {
		if !bytes.Equal(r.Bytes(), pattern(256, byte(i))) {
			t.Fatalf("adopted block %d holds other bytes", i)
		}
	}
	if _, err := worker.Adopt(ctx, pin.Token); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("second Adopt: %v, want ErrNotFound", err)
	}
	if err := pin.Release(); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("Release after Adopt: %v, want ErrNotFound", err)
	}
	if st := n.stats(t); st.GetPinnedBlocks() != 5 {
		t.Fatalf("after the refused calls: pinned %d, want 5", st.GetPinnedBlocks())
	}
	if err := worker.ReleaseBatch(rs); err != nil {
		t.Fatal(err)
	}
	if st := n.stats(t); st.GetPinnedBlocks() != 0 {
		t.Fatalf("after release: pinned %d", st.GetPinnedBlocks())
	}
	// Release of an unadopted pin drops it at once.
	pin, err = sched.LookupPin(ctx, "ns", hs)
	if err != nil {
		t.Fatal(err)
	}
	if err := pin.Release(); err != nil {
		t.Fatal(err)
	}
	if st := n.stats(t); st.GetPinnedBlocks() != 0 {
		t.Fatalf("after Pin.Release: pinned %d", st.GetPinnedBlocks())
	}
}

// TestPinExpires: a pin nobody adopts ends at the lease timeout.
func TestPinExpires(t *testing.T) {
	n := startNode(t, func(c *config.Config) {
		c.LockTimeout = 300 * time.Millisecond
		c.GCInterval = 50 * time.Millisecond
	})
	c := n.dial(t)
	ctx := context.Background()
	hs := chain(3)
	putChain(t, c, "ns", hs)
	pin, err := c.LookupPin(ctx, "ns", hs)
	if err != nil || pin.N != 3 {
		t.Fatalf("LookupPin = %+v, %v", pin, err)
	}
	if st := n.stats(t); st.GetPinnedBlocks() != 3 {
		t.Fatalf("pinned %d, want 3", st.GetPinnedBlocks())
	}
	n.waitStats(t, "pin expiry", func(st *pegadv1.StatsResponse) bool { return st.GetPinnedBlocks() == 0 })
	if _, err := n.dial(t).Adopt(ctx, pin.Token); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Adopt of an expired pin: %v, want ErrNotFound", err)
	}
}

// TestKilledAdopterEndsPin: a pin adopted by a process killed with SIGKILL
// ends with it.
func TestKilledAdopterEndsPin(t *testing.T) {
	n := startNode(t, nil) // lock-timeout 2 min: only the disconnect can end the pin in time
	c := n.dial(t)
	ctx := context.Background()
	hs := chain(4)
	putChain(t, c, "ns", hs)
	pin, err := c.LookupPin(ctx, "ns", hs)
	if err != nil || pin.N != 4 {
		t.Fatalf("LookupPin = %+v, %v", pin, err)
	}
	cmd := startHelper(t, "ready 4", helperEnv+"="+n.socket, helperAdoptEnv+"="+hex.EncodeToString(pin.Token))
	if st := n.stats(t); st.GetPinnedBlocks() != 4 {
		t.Fatalf("adopted: pinned %d, want 4", st.GetPinnedBlocks())
	}
	if err := cmd.Process.Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	n.waitStats(t, "after kill -9 of the adopter", func(st *pegadv1.StatsResponse) bool { return st.GetPinnedBlocks() == 0 })
}

// TestLookupCluster: with two daemons on a real Redis, B finds A's longer
// prefix through the index and prefetches the tail it lacks.
func TestLookupCluster(t *testing.T) {
	ctx := context.Background()
	if _, err := startNode(t, nil).dial(t).LookupCluster(ctx, "ns", chain(1)); !errors.Is(err, client.ErrInvalid) {
		t.Fatalf("LookupCluster on a standalone daemon: %v, want ErrInvalid", err)
	}
	r := testutil.StartRedis(t)
	withIndex := func(c *config.Config) {
		c.ClusterRedis = r.URL()
		c.ClusterTTL = time.Second
	}
	a, b := startNode(t, withIndex), startNode(t, withIndex)
	ca, cb := a.dial(t), b.dial(t)
	hs := chain(6)
	putChain(t, ca, "ns", hs[:5])
	putChain(t, cb, "ns", hs[:2])
	var hit client.ClusterHit
	deadline := time.Now().Add(10 * time.Second)
	for { // the holder publishes asynchronously
		var err error
		hit, err = cb.LookupCluster(ctx, "ns", hs)
		if err != nil {
			t.Fatal(err)
		}
		if hit.N == 5 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if hit.N != 5 || hit.Local != 2 || hit.Peer != a.peer {
		t.Fatalf("LookupCluster = %+v; want 5 at %s, 2 local", hit, a.peer)
	}
	if _, err := cb.Prefetch(ctx, "ns", hs[hit.Local:hit.N], client.FromPeer(hit.Peer)); err != nil {
		t.Fatal(err)
	}
	if got := mustLookup(t, cb, "ns", hs); got != 5 {
		t.Fatalf("after the prefetch B holds %d, want 5", got)
	}
}
