package ssd

import (
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

// BenchmarkOpenVsHeaderRead (make bench): start-up of a full tier — Open
// rebuilding the index from every record's header, then Close — against a
// plain sequential pread of the same headers (one Align read each, in
// file order, through a file opened the same way). The ratio is what the
// index, the scan's checks and opening the log add to the disk reads.
func BenchmarkOpenVsHeaderRead(b *testing.B) {
	const size, block = 128 << 20, 64 << 10
	o := Options{Paths: []string{filepath.Join(b.TempDir(), "dev")}, Size: size, Log: zerolog.Nop()}
	tr, err := Open(o)
	if err != nil {
		b.Fatal(err)
	}
	data := pattern(1, block)
	for i := 0; i < int(size/(block+Align))+8; i++ { // fill, wrapping the ring once
		tr.Spill(key(i), sizes2(block), block, func(dst []byte) { copy(dst, data) })
		for tr.Stats().Queued > 64 {
			time.Sleep(100 * time.Microsecond)
		}
	}
	for tr.Stats().Queued > 0 {
		time.Sleep(time.Millisecond)
	}
	var offs []int64
	tr.mu.Lock()
	for _, l := range tr.index {
		offs = append(offs, l.off)
	}
	tr.mu.Unlock()
	blocks := len(offs)
	slices.Sort(offs)
	if err := tr.Close(); err != nil {
		b.Fatal(err)
	}

	var openD, readD time.Duration
	buf := alignedBuf(Align)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		tr, err := Open(o)
		if err != nil {
			b.Fatal(err)
		}
		if got := int(tr.Stats().Blocks); got != blocks {
			b.Fatalf("%d blocks recovered, %d written", got, blocks)
		}
		if err := tr.Close(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		f, _, err := openLog(filepath.Join(o.Paths[0], LogName))
		if err != nil {
			b.Fatal(err)
		}
		for _, off := range offs {
			if _, err := f.ReadAt(buf, off); err != nil {
				b.Fatal(err)
			}
		}
		_ = f.Close()
		openD += t1.Sub(t0)
		readD += time.Since(t1)
	}
	b.ReportMetric(openD.Seconds()*1000/float64(b.N), "open-ms")
	b.ReportMetric(readD.Seconds()*1000/float64(b.N), "headers-ms")
	b.ReportMetric(float64(blocks), "blocks")
}
