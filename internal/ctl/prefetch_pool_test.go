package ctl

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// blockHashes are n distinct hex hashes for pegactl, and their bytes.
func blockHashes(n int) ([]string, [][]byte) {
	hexes, raw := make([]string, n), make([][]byte, n)
	for i := range n {
		raw[i] = []byte{0xb1, byte(i >> 8), byte(i)}
		hexes[i] = fmt.Sprintf("%x", raw[i])
	}
	return hexes, raw
}

// TestPrefetchLargerThanThePool (issue 33, item 7): a prefetch larger than
// the requester's pool fetched window after window, each one's staging
// evicting the blocks the windows before it had fetched, and still
// answered "fetched" for every block, with exit status 0. It now keeps
// what it fetched (none of its blocks is evicted for a later one),
// fetches what fits in request order, and reports the rest not_fetched,
// exiting 1.
func TestPrefetchLargerThanThePool(t *testing.T) {
	const n, size = 10, 1 << 20
	holder := cluster.Start(t, cluster.Named("pool-holder"), cluster.WithConfig(func(c *config.Config) {
		c.MetricsListen = ""
		// Lock windows of 2 MiB (half the per-peer pin cap): the fetch
		// runs as five windows, as a large one into a 256 MiB pool does.
		c.MaxPinnedBytesPerPeer = 4 << 20
	}))
	req := cluster.Start(t, cluster.Named("pool-requester"), cluster.WithConfig(func(c *config.Config) {
		c.MetricsListen = ""
		c.PoolSize = 4 << 20 // room for four of the ten blocks
	}))
	hexes, raw := blockHashes(n)
	hc := holder.Client(t)
	for i, h := range raw {
		if err := hc.Put(context.Background(), "ns", h, make([]byte, size)); err != nil {
			t.Fatalf("put %d on the holder: %v", i, err)
		}
	}

	r := run(t, nil, append([]string{"--socket", req.SocketPath(), "-o", "json", "prefetch",
		"--peer", holder.PeerAddr(), "--namespace", "ns"}, hexes...)...)
	var res prefetchResult
	decodeJSON(t, r.stdout, &res)
	fetched := 0
	for i, b := range res.Blocks {
		switch {
		case b.Status == "fetched" && i == fetched:
			fetched++
		case b.Status == "not_fetched" && i >= fetched && strings.Contains(b.Error, "pool too small"):
		default:
			t.Errorf("block %d (%s): %s %q, want a prefix fetched and the rest not_fetched (pool too small)", i, b.Hash, b.Status, b.Error)
		}
	}
	if fetched == 0 || fetched == n {
		t.Errorf("%d of %d blocks fetched into a pool with room for 4", fetched, n)
	}
	wantError(t, r, ExitError, fmt.Sprintf("%d of %d blocks not fetched from %s (%d not_fetched)", n-fetched, n, holder.PeerAddr(), n-fetched))

	// Every block said fetched is there.
	st := req.Stats(t)
	if int(st.GetBlocks()) != fetched {
		t.Errorf("the requester holds %d blocks after a prefetch that said %d fetched", st.GetBlocks(), fetched)
	}
	rc := req.Client(t)
	for i := range fetched {
		if _, err := rc.Get(context.Background(), "ns", raw[i], make([]byte, size)); err != nil {
			t.Errorf("block %s said fetched: %v", hexes[i], err)
		}
	}
}
