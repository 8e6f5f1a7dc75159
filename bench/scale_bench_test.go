package bench

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/holder"
)

// BenchmarkSessionsAtScale: the holder's lock table with 1,000,000 live
// sessions (each pinning one block, 256 requester nodes), measured in
// process (no gRPC) so that only the table's own costs show:
//
//   - tick1m-ns/op vs tick1k-ns/op: an ExpireBefore that expires nothing
//     with 1M live sessions vs with 1k (target ≤ 10 µs; ratio ≈ 1 when a
//     tick costs nothing per live session);
//   - p99sweep-ns/op vs p99idle-ns/op: p99 of an in-process query+release
//     pair on the 1M table while a sweeper ticks every millisecond vs with
//     no sweeper;
//   - session-B/op vs mapentry-B/op: live heap per session (after GC) vs
//     the heap of a bare map from a 32-character id to a 32-byte record,
//     the least any table indexing sessions by id can take (target ≤ 200 B
//     per session + 16 B per locked block).
func BenchmarkSessionsAtScale(b *testing.B) {
	if testing.Short() {
		b.Skip("1M sessions: not in -short")
	}
	const live = 1_000_000
	st, hashes := newStore(b, 4<<20, 1, 4096)
	var now atomic.Int64
	base := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	now.Store(base.UnixNano())
	nowFn := func() time.Time { return time.Unix(0, now.Load()) }
	mk := func() *holder.Service {
		svc := newHolder(b, holder.Options{Store: st, Log: zerolog.Nop(), LockTimeout: time.Hour, Now: nowFn})
		b.Cleanup(func() { svc.Locks().ReleaseAll("benchmark done") })
		return svc
	}
	ctx := context.Background()
	reqs := make([]*pegadv1.QueryBlocksForTransferRequest, 256)
	for i := range reqs {
		reqs[i] = &pegadv1.QueryBlocksForTransferRequest{Namespace: "bench", Hashes: hashes,
			Requester: &pegadv1.Requester{NodeId: fmt.Sprintf("node-%d", i), Incarnation: "1"}}
	}
	open := func(svc *holder.Service, i int) string {
		q, err := svc.QueryBlocksForTransfer(ctx, reqs[i%len(reqs)])
		if err != nil {
			b.Fatalf("query: %v", err)
		}
		return q.GetSessionId()
	}

	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	h0 := heap()
	big := mk()
	for i := range live {
		open(big, i)
	}
	perSession := float64(heap()-h0) / live
	h1 := heap()
	m := make(map[string]*[32]byte, live)
	for i := range live {
		m[fmt.Sprintf("%032x", i)] = new([32]byte)
	}
	perEntry := float64(heap()-h1) / live
	runtime.KeepAlive(m)
	m = nil
	small := mk()
	for i := range 1000 {
		open(small, i)
	}

	// Latency of a pair on the 1M table, with and without a sweeper.
	pairs := func(n int) []time.Duration {
		d := make([]time.Duration, n)
		for i := range d {
			start := time.Now()
			id := open(big, i)
			if _, err := big.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{SessionId: id,
				Requester: reqs[i%len(reqs)].GetRequester()}); err != nil {
				b.Fatalf("release: %v", err)
			}
			d[i] = time.Since(start)
		}
		return d
	}
	p99 := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)*99/100]
	}

	var tickBig, tickSmall, idle, sweep clock
	for b.Loop() {
		tickBig.time(func() {
			if n := big.Locks().ExpireBefore(nowFn()); n != 0 {
				b.Fatalf("expired %d", n)
			}
		})
		tickSmall.time(func() {
			if n := small.Locks().ExpireBefore(nowFn()); n != 0 {
				b.Fatalf("expired %d", n)
			}
		})
	}
	// The sweeper, as lease.Sweep drives it, ticks every millisecond while
	// sweeping is set; idle and sweeping chunks of pairs alternate so that
	// both see the same machine.
	var sweeping atomic.Bool
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if sweeping.Load() {
					big.Locks().ExpireBefore(nowFn())
				}
			}
		}
	}()
	runtime.GC()
	var idleD, sweepD []time.Duration
	for range 10 {
		idleD = append(idleD, pairs(2000)...)
		sweeping.Store(true)
		sweepD = append(sweepD, pairs(2000)...)
		sweeping.Store(false)
	}
	close(stop)
	<-done
	idle.total, idle.n = p99(idleD), 1
	sweep.total, sweep.n = p99(sweepD), 1
	reportLatency(b, "tick1m", "tick1k", &tickBig, &tickSmall)
	reportLatency(b, "p99sweep", "p99idle", &sweep, &idle)
	b.ReportMetric(perSession, "session-B/op")
	b.ReportMetric(perEntry, "mapentry-B/op")
	b.ReportMetric(perSession/perEntry, "session-ratio")
	if n := big.Locks().Len(); n != live {
		b.Fatalf("%d sessions live, want %d", n, live)
	}
}
