package tcp

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
	"github.com/pegaflow/pegad/internal/testutil"
)

// BenchmarkReadVsTCP measures READ throughput of the provider (64 MiB in
// 1 MiB WRs spread over N QPs) next to N plain TCP streams on the same
// loopback copying the same bytes between the same kind of buffers, both
// in every iteration, and reports both rates and their ratio.
func BenchmarkReadVsTCP(b *testing.B) {
	const total, wrSize = 64 << 20, 1 << 20
	for _, nqp := range []int{1, 4} {
		b.Run(fmt.Sprintf("qps=%d", nqp), func(b *testing.B) {
			_, d := newBenchProvider(b)
			per := total / nqp
			type pair struct {
				req      *ibvtest.Side
				lmr, rmr ibv.MR
			}
			pairs := make([]pair, nqp)
			for i := range pairs {
				req, peer := ibvtest.Pair(b, d[0], d[1], ibvtest.DefaultCap())
				_, rmr := ibvtest.Region(b, peer, per, accRead, uint64(i))
				_, lmr := ibvtest.Region(b, req, per, accRead, 0)
				pairs[i] = pair{req, lmr, rmr}
			}
			src := ibvtest.MapMemory(b, total)
			dst := ibvtest.MapMemory(b, total)
			ibvtest.Fill(src, 1)
			streams := testutil.NewStreams(b, "tcp", "127.0.0.1:0", nqp)

			var provDur, plainDur time.Duration
			run := func() {
				start := time.Now()
				var wg sync.WaitGroup
				for _, p := range pairs {
					wg.Go(func() {
						var wrs []ibv.SendWR
						for off := 0; off < per; off += wrSize {
							wrs = append(wrs, readWR(uint64(off), p.lmr, p.rmr, uint64(off), wrSize))
						}
						post(b, p.req.QP, wrs...)
						for _, wc := range ibvtest.Collect(b, p.req.CQ, len(wrs)) {
							if wc.Status != ibv.WCSuccess {
								b.Errorf("completion %+v", wc)
							}
						}
					})
				}
				wg.Wait()
				provDur += time.Since(start)

				start = time.Now()
				streams.Copy(b, src, dst, 1<<20)
				plainDur += time.Since(start)
			}
			run() // warm up: first touch of every page, connections dialed
			provDur, plainDur = 0, 0
			b.ResetTimer()
			for range b.N {
				run()
			}
			b.StopTimer()
			prov := float64(b.N) * total / provDur.Seconds() / 1e6
			plain := float64(b.N) * total / plainDur.Seconds() / 1e6
			b.ReportMetric(prov, "provider-MB/s")
			b.ReportMetric(plain, "plain-tcp-MB/s")
			b.ReportMetric(prov/plain, "ratio")
			b.Logf("qps=%d: tcp provider READ %.0f MB/s, plain TCP %.0f MB/s, ratio %.2f", nqp, prov, plain, prov/plain)
		})
	}
}

func newBenchProvider(b *testing.B) (*Provider, [2]*Device) {
	b.Helper()
	p, err := NewProvider(DeviceOptions{Name: "req"}, DeviceOptions{Name: "peer"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { p.Close() })
	var d [2]*Device
	for i, n := range []string{"req", "peer"} {
		dev, _ := p.Open(n)
		d[i] = dev.(*Device)
	}
	return p, d
}

// BenchmarkReadWR is the hot path of one work request, both sides in this
// process: post one signaled READ, the responder writes header and
// registered memory in one writev, the requester reads the payload
// straight into local memory, the completion is polled. Run it with
// -benchmem: a warm QP allocates nothing per work request (0 allocs/op).
func BenchmarkReadWR(b *testing.B) {
	for _, size := range []int{64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) {
			_, d := newBenchProvider(b)
			req, peer := ibvtest.Pair(b, d[0], d[1], ibvtest.DefaultCap())
			_, rmr := ibvtest.Region(b, peer, size, accRead, 1)
			_, lmr := ibvtest.Region(b, req, size, accRead, 2)
			wrs := []ibv.SendWR{readWR(1, lmr, rmr, 0, uint32(size))}
			wcs := make([]ibv.WorkCompletion, 1)
			ctx := context.Background()
			one := func() {
				if _, err := req.QP.PostSend(wrs); err != nil {
					b.Fatal(err)
				}
				for {
					n, err := req.CQ.Poll(wcs)
					if err != nil {
						b.Fatal(err)
					}
					if n == 1 {
						break
					}
					if err := req.CQ.Wait(ctx); err != nil {
						b.Fatal(err)
					}
				}
				if wcs[0].Status != ibv.WCSuccess {
					b.Fatalf("completion %+v", wcs[0])
				}
			}
			for range 16 { // warm: connection dialed, buffers grown
				one()
			}
			b.SetBytes(int64(size))
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				one()
			}
		})
	}
}
