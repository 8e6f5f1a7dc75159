package pool

import (
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// BenchmarkPoolStartVsMemset: mapping and populating a pool (New: parallel
// populate) against one thread mapping and zero-filling the same size, in
// seconds per GiB. The ratio is what a start-up with a large pool pays
// over the plainest way of touching its memory.
func BenchmarkPoolStartVsMemset(b *testing.B) {
	const size = 256 << 20
	var start, memset time.Duration
	for b.Loop() {
		t0 := time.Now()
		p, err := New(Options{Size: size, Log: zerolog.Nop()})
		if err != nil {
			b.Fatal(err)
		}
		start += time.Since(t0)
		if err := p.Close(); err != nil {
			b.Fatal(err)
		}

		t0 = time.Now()
		mem, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			b.Fatal(err)
		}
		clear(mem)
		memset += time.Since(t0)
		if err := unix.Munmap(mem); err != nil {
			b.Fatal(err)
		}
	}
	perGiB := func(d time.Duration) float64 { return d.Seconds() / float64(b.N) / (float64(size) / (1 << 30)) }
	b.ReportMetric(perGiB(start), "start-s/GiB")
	b.ReportMetric(perGiB(memset), "memset-s/GiB")
}
