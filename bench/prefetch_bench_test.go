package bench

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/config"
)

// BenchmarkPrefetchVsTCP: end to end, two daemons in this process on
// loopback (tcp transport, the default 1 NIC x 2 QPs per peer): requester
// B prefetches 16 blocks of 4 MiB (64 MiB) from holder A — query+lock on
// A's peer port, RDMA READs by B's connection workers over the tcp
// provider into B's pool, index, release — next to 2 plain TCP streams
// (one per QP) copying the same 64 MiB in 1 MiB writes, in every
// iteration. B's copies are deleted after each iteration, outside the
// timings. Reports prefetch-MB/s, tcp-MB/s and prefetch-ratio
// (subject/baseline; higher is better).
func BenchmarkPrefetchVsTCP(b *testing.B) { benchPrefetch(b, 0) }

// BenchmarkPrefetchQPsVsTCP is BenchmarkPrefetchVsTCP with both daemons
// set to 1 and to 4 QPs per peer, each beside as many plain TCP streams
// (issue 11.1: 1 QP against one stream, N QPs against N streams).
func BenchmarkPrefetchQPsVsTCP(b *testing.B) {
	for _, qps := range []int{1, 4} {
		b.Run(fmt.Sprintf("qps=%d", qps), func(b *testing.B) { benchPrefetch(b, qps) })
	}
}

// benchPrefetch runs the prefetch pair with qps QPs per peer (0: the
// daemons' default).
func benchPrefetch(b *testing.B, qps int) {
	const blocks, blockSize = 16, 4 << 20
	const total = blocks * blockSize
	withQPs := func(c *config.Config) {
		if qps > 0 {
			c.QPsPerPeer = qps
		}
	}
	holderNode := startNode(b, "holder", 128<<20, withQPs)
	req := startNode(b, "requester", 128<<20, withQPs)
	qps = holderNode.d.Config().QPsPerPeer
	hashes := make([][]byte, blocks)
	for i := range hashes {
		hashes[i] = fmt.Appendf(nil, "%032x", i)
		holderNode.put(b, "bench", hashes[i], pattern(blockSize, byte(i)))
	}
	raw := newStreams(b, "tcp", qps)
	src, dst := pattern(total, 1), pattern(total, 2)

	ctx := context.Background()
	preq := &pegadv1.PrefetchRequest{Peer: holderNode.d.PeerAddr(), Namespace: "bench", Hashes: hashes,
		Timeout: durationpb.New(time.Minute)}
	var pf, plain clock
	iter := func() {
		pf.time(func() {
			r, err := req.local.Prefetch(ctx, preq)
			if err != nil {
				b.Fatal(err)
			}
			for _, blk := range r.GetBlocks() {
				if blk.GetStatus() != pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED {
					b.Fatalf("block %s: %v %s", blk.GetHash(), blk.GetStatus(), blk.GetError())
				}
			}
			if r.GetBytes() != total {
				b.Fatalf("prefetched %d bytes, want %d", r.GetBytes(), total)
			}
		})
		for _, h := range hashes {
			req.delete(b, "bench", h)
		}
		plain.time(func() { raw.Copy(b, src, dst, 1<<20) })
	}
	iter() // warm up: connection handshake, first touch of pool pages
	pf, plain = clock{}, clock{}
	for b.Loop() {
		iter()
	}
	reportRate(b, "prefetch", "tcp", &pf, &plain, total)
}
