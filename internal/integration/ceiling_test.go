package integration

import (
	"context"
	"fmt"
	"testing"

	"github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/evict"
)

// ceilingNode is a node whose 1 MiB pool holds 16 blocks of 64 KiB,
// evicting in LRU order, with a data-socket client.
func ceilingNode(t *testing.T) (*node, *client.Client) {
	t.Helper()
	cfg := baseConfig(t, "ceiling")
	cfg.PoolSize = 1 << 20
	cfg.Eviction = string(evict.KindLRU)
	n := start(t, cfg)
	return n, n.cn.Client(t)
}

func ceilingHash(i int) []byte { return fmt.Appendf(nil, "h%04d", i) }

func ceilingPut(t *testing.T, c *client.Client, from, to int) {
	t.Helper()
	for i := from; i < to; i++ {
		if err := c.Put(context.Background(), "m@tp0", ceilingHash(i), make([]byte, 64<<10)); err != nil {
			t.Fatalf("put %d: %v", i, err)
		}
	}
}

func ceilingLookup(t *testing.T, c *client.Client, from, to, want int) {
	t.Helper()
	hs := make([][]byte, 0, to-from)
	for i := from; i < to; i++ {
		hs = append(hs, ceilingHash(i))
	}
	if got, err := c.Lookup(context.Background(), "m@tp0", hs); err != nil || got != want {
		t.Fatalf("Lookup of %d..%d = %d, %v; want %d", from, to, got, err, want)
	}
}

// ceilingFigures are the node's ceiling series for namespace label m and
// the Stats answer's count.
type ceilingFigures struct{ recomputed, ratio, ceiling, statsRecomputed float64 }

func ceilingOf(t *testing.T, n *node) ceilingFigures {
	t.Helper()
	m := n.cn.Scrape(t)
	return ceilingFigures{
		recomputed:      m[`pegaflow_recomputed_blocks_total{namespace="m"}`],
		ratio:           m[`pegaflow_prefix_hit_ratio{namespace="m"}`],
		ceiling:         m[`pegaflow_prefix_hit_ratio_ceiling{namespace="m"}`],
		statsRecomputed: float64(n.cn.Stats(t).GetRecomputedBlocks()),
	}
}

// TestHitRatioCeiling: a pool of 16 blocks takes 24, so the first 8 are
// evicted; an engine looks 8 of them up (8 misses), puts 4 of them again
// (4 recomputed: this node held them), puts 2 it never held (not
// recomputed), and looks up 8 stored ones (8 hits). The real ratio is
// 8/16 and the ceiling (8+4)/16, exactly.
func TestHitRatioCeiling(t *testing.T) {
	n, c := ceilingNode(t)
	ceilingPut(t, c, 0, 24)        // h0..h7 evicted
	ceilingLookup(t, c, 0, 8, 0)   // 8 misses
	ceilingPut(t, c, 0, 4)         // 4 recomputed, evicting h8..h11
	ceilingPut(t, c, 100, 102)     // first puts, evicting h12, h13
	ceilingLookup(t, c, 16, 24, 8) // 8 hits
	want := ceilingFigures{recomputed: 4, ratio: 0.5, ceiling: 0.75, statsRecomputed: 4}
	if got := ceilingOf(t, n); got != want {
		t.Fatalf("after 8 hits, 8 misses, 4 recomputed: %+v, want %+v", got, want)
	}
	// The blocks evicted by the re-puts, put again: recomputed too.
	ceilingPut(t, c, 8, 10)
	if got := ceilingOf(t, n); got.recomputed != 6 || got.ceiling != 14.0/16 {
		t.Fatalf("after 2 more re-puts: %+v, want 6 recomputed, ceiling 14/16", got)
	}
}

// TestHitRatioCeilingLookupsAlone: a scheduler asking again and again for
// a chain this node evicted adds misses only. Nothing it asks is counted
// as recomputed, so the ceiling rises above nothing it did not put: the
// gap to the real ratio stays recomputed / looked-up blocks, and the
// ceiling moves with the real ratio's denominator alone.
func TestHitRatioCeilingLookupsAlone(t *testing.T) {
	n, c := ceilingNode(t)
	ceilingPut(t, c, 0, 20)       // h0..h3 evicted
	ceilingLookup(t, c, 0, 4, 0)  // 4 misses
	ceilingPut(t, c, 0, 2)        // 2 recomputed
	ceilingLookup(t, c, 8, 12, 4) // 4 hits
	before := ceilingOf(t, n)
	if want := (ceilingFigures{recomputed: 2, ratio: 0.5, ceiling: 0.75, statsRecomputed: 2}); before != want {
		t.Fatalf("before the repeated lookups: %+v, want %+v", before, want)
	}
	for range 50 { // h2, h3: evicted, never put again
		ceilingLookup(t, c, 2, 4, 0)
	}
	got := ceilingOf(t, n)
	looked := 8.0 + 50*2
	if want := (ceilingFigures{recomputed: 2, ratio: 4 / looked, ceiling: 6 / looked, statsRecomputed: 2}); got != want {
		t.Fatalf("after 50 lookups of an evicted chain: %+v, want %+v", got, want)
	}
	if got.ceiling-got.ratio > before.ceiling-before.ratio {
		t.Fatalf("repeated lookups widened the gap: %v → %v", before.ceiling-before.ratio, got.ceiling-got.ratio)
	}
}
