package bench

import (
	"encoding/hex"
	"fmt"
	"testing"

	"github.com/pegaflow/pegad/internal/config"
)

// BenchmarkPrefetchWindowsVsTCP: issue 23's pipelined prefetch. Two daemons
// with default flags but 1 QP per peer, the holder's pool 700 MiB (so its
// per-peer pin cap, half the pool, is 350 MiB): `pegactl prefetch` of 145
// blocks of 4 MiB (580 MiB, more than the cap), which the requester
// fetches in lock windows that fit the cap, each locked while the one
// before it is read. Beside it in every iteration, one plain TCP stream
// copies the same 580 MiB in 1 MiB writes. The requester's copies are
// deleted after each iteration, outside the timings; one iteration warms
// the pools first. Reports windows-MB/s, tcp-MB/s and windows-ratio
// (higher is better; the target is 0.95).
func BenchmarkPrefetchWindowsVsTCP(b *testing.B) {
	const blocks, blockSize = 145, 4 << 20
	const total = blocks * blockSize
	oneQP := func(c *config.Config) { c.QPsPerPeer = 1 }
	holderNode := startNode(b, "holder", 700<<20, oneQP)
	req := startNode(b, "requester", 700<<20, oneQP)
	args := []string{"prefetch", "--peer", holderNode.d.PeerAddr(), "--namespace", "bench"}
	hashes := make([][]byte, blocks)
	for i := range hashes {
		hashes[i] = fmt.Appendf(nil, "w%031x", i)
		holderNode.put(b, "bench", hashes[i], pattern(blockSize, byte(i)))
		args = append(args, hex.EncodeToString(hashes[i]))
	}
	raw := newStreams(b, "tcp", 1)
	src, dst := pattern(total, 1), pattern(total, 2)
	var pf, plain clock
	iter := func() {
		pf.time(func() { req.pegactl(b, args...) })
		for _, h := range hashes {
			if n := req.get(b, "bench", h); n != blockSize {
				b.Fatalf("block %s: %d bytes after the prefetch, want %d", h, n, blockSize)
			}
			req.delete(b, "bench", h)
		}
		plain.time(func() { raw.Copy(b, src, dst, 1<<20) })
	}
	iter() // warm up: connection handshake, first touch of pool pages
	pf, plain = clock{}, clock{}
	for b.Loop() {
		iter()
	}
	reportRate(b, "windows", "tcp", &pf, &plain, total)
}
