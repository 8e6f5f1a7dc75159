package redisindex

import (
	"context"
	"crypto/sha256"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/store"
	"github.com/pegaflow/pegad/internal/testutil"
)

func usedMemory(tb testing.TB, r *testutil.Redis) int64 {
	tb.Helper()
	info, err := r.Client(tb).Info(context.Background(), "memory").Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, l := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(l, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	tb.Fatal("INFO memory has no used_memory")
	return 0
}

// BenchmarkAnnounce measures what docs/cluster.md's scale model uses:
// Redis memory per indexed (node, block) entry, for a block's first holder
// and for a second holder of the same blocks, and announce throughput
// (pipelines of DefaultMaxBatch, one connection). 32-byte hashes, a
// 10-byte namespace, 13-byte node ids.
func BenchmarkAnnounce(b *testing.B) {
	r := testutil.StartRedis(b)
	const n = 100_000
	keys := make([]store.Key, n)
	for i := range keys {
		h := sha256.Sum256([]byte(fmt.Sprint(i)))
		keys[i] = store.Key{Namespace: "llama3-70b", Hash: string(h[:])}
	}
	ctx := context.Background()
	var first, second, rate float64
	for b.Loop() {
		if err := r.Client(b).FlushAll(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		base := usedMemory(b, r)
		for j, node := range []string{"gpu-node-0001", "gpu-node-0002"} {
			x, err := Open(Options{URLs: r.URL(), NodeID: node, Incarnation: "0123456789abcdef", TTL: 10 * time.Second, Metrics: metricstest.NewCluster()})
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			for i := 0; i < n; i += 1024 {
				if err := x.Announce(ctx, index.MediumDRAM, keys[i:min(i+1024, n)]); err != nil {
					b.Fatal(err)
				}
			}
			if j == 0 {
				rate = n / time.Since(start).Seconds()
			}
			_ = x.Close()
			m := usedMemory(b, r)
			if j == 0 {
				first = float64(m-base) / n
			} else {
				second = float64(m-base) / n
			}
			base = m
		}
	}
	b.ReportMetric(first, "B/entry-first")
	b.ReportMetric(second, "B/entry-second")
	b.ReportMetric(rate, "entries/s")
}
