package bench

import (
	"fmt"
	"testing"
)

// BenchmarkLocalPutGetVsUnix: one 4 MiB block stored with PutBlock and read
// back with GetBlock over the daemon's unix socket (gRPC streams of 1 MiB
// messages, into and out of the pinned pool), next to a raw stream on a
// unix socket moving the same 4 MiB in 1 MiB writes, in every iteration.
// Reports put-MB/s, get-MB/s, unix-MB/s and put-ratio, get-ratio
// (subject/baseline; higher is better, 1 would mean gRPC + pool cost
// nothing). The block is deleted after each iteration, outside the timings,
// so no put pays for an eviction.
func BenchmarkLocalPutGetVsUnix(b *testing.B) {
	const size = 4 << 20
	n := startNode(b, "local", 64<<20)
	raw := newStreams(b, "unix", 1)
	body := pattern(size, 1)
	dst := pattern(size, 2)
	var put, get, unix clock
	iter := func(i int) {
		hash := fmt.Appendf(nil, "%016x", i)
		put.time(func() { n.put(b, "bench", hash, body) })
		get.time(func() {
			if got := n.get(b, "bench", hash); got != size {
				b.Fatalf("GetBlock returned %d bytes, want %d", got, size)
			}
		})
		n.delete(b, "bench", hash)
		unix.time(func() { raw.Copy(b, body, dst, 1<<20) })
	}
	iter(-1) // warm up: connections, first touch of pool pages
	put, get, unix = clock{}, clock{}, clock{}
	for i := 0; b.Loop(); i++ {
		iter(i)
	}
	reportRate(b, "put", "unix", &put, &unix, size)
	reportRate(b, "get", "unix", &get, &unix, size)
}
