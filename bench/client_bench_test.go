package bench

import (
	"context"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"testing"

	"github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/config"
)

// dialClient connects the public client to n's daemon.
func dialClient(b *testing.B, n *node) *client.Client {
	b.Helper()
	c, err := client.Dial(context.Background(), n.d.SocketPath())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// BenchmarkClientPutGetVsMemcpy: one 4 MiB block stored with client.Put
// (alloc, one copy into the shared pool, commit) and read back with
// client.Get (lease, one copy out, release), next to plain copies of the
// same 4 MiB between heap buffers along the same path, in every iteration:
// memcpyin copies body into a buffer (as Put copies body into the pool),
// memcpyout copies that freshly written buffer out again (as Get copies
// what Put just wrote). The two baselines differ because a copy this large
// leaves its destination out of the cache (non-temporal stores), so the
// second copy reads from memory, not from the cache. Reports put-MB/s,
// get-MB/s, memcpyin-MB/s, memcpyout-MB/s and put-ratio, get-ratio (1: the
// round trips cost nothing beside the copy). The block is deleted after
// each iteration, outside the timings.
func BenchmarkClientPutGetVsMemcpy(b *testing.B) {
	putGetVsMemcpy(b, 4<<20, 64<<20)
}

// BenchmarkClientPutGetSizes: BenchmarkClientPutGetVsMemcpy's pair from
// 64 KiB to 64 MiB (issue 36 item 4). A fixed cost per call (the round
// trips) shows as ratios that climb toward 1 with the size; cache
// behaviour shows as a ratio that moves where the copy leaves the
// last-level cache, and the memcpy baselines moving with it.
func BenchmarkClientPutGetSizes(b *testing.B) {
	for _, size := range []int{64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20} {
		b.Run(fmt.Sprintf("size=%dKiB", size>>10), func(b *testing.B) {
			putGetVsMemcpy(b, size, config.ByteSize(max(64<<20, 3*size)))
		})
	}
}

// putGetVsMemcpy times client.Put and client.Get of one size-byte block
// beside the memcpy baselines, on a node with a pool of pool bytes.
func putGetVsMemcpy(b *testing.B, size int, pool config.ByteSize) {
	b.Helper()
	n := startNode(b, "client", pool)
	c := dialClient(b, n)
	ctx := context.Background()
	body, dst, cp, cp2 := pattern(size, 1), make([]byte, size), make([]byte, size), make([]byte, size)
	var put, get, memIn, memOut clock
	iter := func(i int) {
		hash := fmt.Appendf(nil, "%016x", i)
		put.time(func() {
			if err := c.Put(ctx, "bench", hash, body); err != nil {
				b.Fatal(err)
			}
		})
		get.time(func() {
			if got, err := c.Get(ctx, "bench", hash, dst); err != nil || got != size {
				b.Fatalf("Get = %d, %v", got, err)
			}
		})
		if err := c.Delete(ctx, "bench", hash); err != nil {
			b.Fatal(err)
		}
		memIn.time(func() { copy(cp, body) })
		memOut.time(func() { copy(cp2, cp) })
	}
	for i := range 4 { // warm up: first touch of the pool's pages in this process
		iter(-1 - i)
	}
	put, get, memIn, memOut = clock{}, clock{}, clock{}, clock{}
	for i := 0; b.Loop(); i++ {
		iter(i)
	}
	reportRate(b, "put", "memcpyin", &put, &memIn, size)
	reportRate(b, "get", "memcpyout", &get, &memOut, size)
}

// BenchmarkClientBatchLeases: 64 blocks of 4 KiB per iteration written
// with AllocBatch + CommitBatch and read with LeaseBatch + ReleaseBatch
// (two round trips each), next to two round trips of the same request size
// through a bare echo server on a unix socket. Reports per block:
// alloccommit-ns/op, leaserelease-ns/op, echo-ns/op (target: ≤ 20 µs per
// block for either pair), and their ratios to the echo.
func BenchmarkClientBatchLeases(b *testing.B) {
	const blocks, size = 64, 4096
	n := startNode(b, "batch", 64<<20)
	c := dialClient(b, n)
	echo := newUnixEcho(b)
	ctx := context.Background()
	reqs := make([]client.AllocRequest, blocks)
	hashes := make([][]byte, blocks)
	frame := make([]byte, blocks*32) // about an ALLOC or LEASE request of 64 items
	var ac, lr, rt clock
	iter := func(i int) {
		for j := range reqs {
			hashes[j] = fmt.Appendf(nil, "%08x-%02x", i, j)
			reqs[j] = client.AllocRequest{Namespace: "bench", Hash: hashes[j], Size: size}
		}
		ac.time(func() {
			res, err := c.AllocBatch(ctx, reqs)
			if err != nil {
				b.Fatal(err)
			}
			ws := make([]*client.Writer, len(res))
			for j, r := range res {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
				r.Writer.Bytes()[0] = byte(j)
				ws[j] = r.Writer
			}
			if err := c.CommitBatch(ctx, ws); err != nil {
				b.Fatal(err)
			}
		})
		lr.time(func() {
			res, err := c.LeaseBatch(ctx, "bench", hashes)
			if err != nil {
				b.Fatal(err)
			}
			rs := make([]*client.Reader, len(res))
			for j, r := range res {
				if r.Err != nil {
					b.Fatal(r.Err)
				}
				rs[j] = r.Reader
			}
			if err := c.ReleaseBatch(rs); err != nil {
				b.Fatal(err)
			}
		})
		rt.time(func() { echo.roundTrip(b, frame); echo.roundTrip(b, frame[:blocks*8]) })
		for _, h := range hashes {
			if err := c.Delete(ctx, "bench", h); err != nil {
				b.Fatal(err)
			}
		}
	}
	iter(-1)
	ac, lr, rt = clock{}, clock{}, clock{}
	for i := 0; b.Loop(); i++ {
		iter(i)
	}
	per := func(c *clock) *clock { return &clock{total: c.total, n: c.n * blocks} }
	reportLatency(b, "alloccommit", "echo", per(&ac), per(&rt))
	reportLatency(b, "leaserelease", "echo", per(&lr), per(&rt))
}

// unixEcho is a unix-socket server that writes back what it reads, in its own
// goroutine (as the daemon answers in its own): the bare cost of a round
// trip.
type unixEcho struct {
	c   net.Conn
	buf []byte
}

func newUnixEcho(b *testing.B) *unixEcho {
	b.Helper()
	ln, err := net.Listen("unix", filepath.Join(shortTempDir(b), "echo.sock"))
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s, err := ln.Accept()
		ln.Close()
		if err != nil {
			return
		}
		defer s.Close()
		_, _ = io.Copy(s, s)
	}()
	c, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); <-done })
	return &unixEcho{c: c, buf: make([]byte, 64<<10)}
}

func (e *unixEcho) roundTrip(b *testing.B, p []byte) {
	if _, err := e.c.Write(p); err != nil {
		b.Fatal(err)
	}
	if _, err := io.ReadFull(e.c, e.buf[:len(p)]); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkLookupChainVsEmpty: a LOOKUP of a 1,000-hash chain, every block
// stored (the daemon walks the whole chain), against an empty round trip:
// a LOOKUP of no hash on the same connection (same framing, daemon and
// socket, nothing to look up). Issue 24 asks for a ratio of at most 2.
func BenchmarkLookupChainVsEmpty(b *testing.B) {
	const blocks = 1000
	n := startNode(b, "lookup", 64<<20)
	c := dialClient(b, n)
	ctx := context.Background()
	hashes := make([][]byte, blocks)
	for i := range hashes {
		hashes[i] = fmt.Appendf(nil, "%032x", i) // 32 bytes, as a sha256-derived chain hash halved
		if err := c.Put(ctx, "bench@tp0", hashes[i], []byte{byte(i)}); err != nil {
			b.Fatal(err)
		}
	}
	var chain, empty clock
	lookup := func(hs [][]byte, want int) {
		got, err := c.Lookup(ctx, "bench@tp0", hs)
		if err != nil || got != want {
			b.Fatalf("Lookup of %d hashes = %d, %v; want %d", len(hs), got, err, want)
		}
	}
	lookup(hashes, blocks) // warm
	for b.Loop() {
		chain.time(func() { lookup(hashes, blocks) })
		empty.time(func() { lookup(nil, 0) })
	}
	reportLatency(b, "lookup1000", "empty", &chain, &empty)
}
