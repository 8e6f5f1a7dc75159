package ssd

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/store"
)

// The fio comparison (make bench; issue 25 item 4): on the same file
// system, with the same I/O size (one record: a 1 MiB block and its 4 KiB
// header) and queue depth, the tier against fio with direct I/O.
//
//   - write: the tier writes evicted blocks sequentially, one write at a
//     time per path (queue depth 1); fio --rw=write --iodepth=1.
//   - read: random single-block reads back (Load: pread, CRC check) from
//     fioQD goroutines; fio --rw=randread --iodepth=fioQD.
//
// fio uses io_uring where the kernel allows it, else libaio. The write
// also reports fio with the tier's own engine (psync: one pwrite at a
// time, QD1) and fio at QD4 (issue 36 item 5). Skipped without fio
// (Debian's package).
const (
	fioBlock  = 1 << 20
	fioBlocks = 64
	fioQD     = 4
)

func BenchmarkTierVsFio(b *testing.B) {
	if _, err := exec.LookPath("fio"); err != nil {
		b.Skip("fio is not installed (apt-get install fio)")
	}
	engine := fioEngine(b)
	for _, mode := range []string{"write", "randread"} {
		b.Run(mode, func(b *testing.B) {
			dir := b.TempDir()
			// One tier, as in a running daemon: a first round (not timed)
			// warms its record buffers; each round then writes new blocks
			// and the ring wraps every fourth.
			tr, err := Open(Options{Paths: []string{dir}, Size: 256 << 20, SegmentSize: 64 << 20, Log: zerolog.Nop()})
			if err != nil {
				b.Fatal(err)
			}
			defer tr.Close()
			round := 0
			tierWrite(b, tr, round)
			var tierBps, fioBps, psyncBps, qd4Bps float64
			file := filepath.Join(dir, "fio.dat")
			for i := 0; i < b.N; i++ {
				round++
				w := tierWrite(b, tr, round)
				if mode == "write" {
					tierBps += w
					// issue 36 item 5: the tier's own engine (pwrite,
					// one at a time) and the QD4 figure beside it.
					psyncBps += runFio(b, "psync", file, mode, 1)
					qd4Bps += runFio(b, engine, file, mode, fioQD)
				} else {
					tierBps += tierRandRead(b, tr, round)
				}
				fioBps += runFio(b, engine, file, mode, 0)
			}
			n := float64(b.N)
			b.ReportMetric(tierBps/n/1e6, "tier-MB/s")
			b.ReportMetric(fioBps/n/1e6, "fio-MB/s")
			if mode == "write" {
				b.ReportMetric(psyncBps/n/1e6, "fio-psync-qd1-MB/s")
				b.ReportMetric(qd4Bps/n/1e6, "fio-qd4-MB/s")
				b.ReportMetric(tierBps/psyncBps, "tier/psync-ratio")
				b.ReportMetric(tierBps/fioBps, "tier/fio-ratio")
			}
		})
	}
}

// tierWrite spills fioBlocks new blocks (keys of round) and returns the
// bytes per second until the last is written.
func tierWrite(b *testing.B, tr *Tier, round int) float64 {
	data := pattern(1, fioBlock)
	sizes := sizes2(fioBlock)
	before := tr.Stats().Blocks
	t0 := time.Now()
	for i := 0; i < fioBlocks; i++ {
		tr.Spill(key(round*fioBlocks+i), sizes, fioBlock, func(dst []byte) { copy(dst, data) })
	}
	for tr.Stats().Queued > 0 {
		time.Sleep(50 * time.Microsecond)
	}
	el := time.Since(t0)
	for i := 0; i < fioBlocks; i++ {
		if !tr.Has(key(round*fioBlocks + i)) {
			b.Fatalf("block %d of round %d not written (%d blocks before)", i, round, before)
		}
	}
	return float64(fioBlocks) * float64(recordLen(key(0), 2, fioBlock)) / el.Seconds()
}

// tierRandRead loads 4×fioBlocks random blocks of round from fioQD
// goroutines.
func tierRandRead(b *testing.B, tr *Tier, round int) float64 {
	const reads = 4 * fioBlocks
	var wg sync.WaitGroup
	t0 := time.Now()
	for g := 0; g < fioQD; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			for i := 0; i < reads/fioQD; i++ {
				if err := tr.Load(key(round*fioBlocks+rng.IntN(fioBlocks)), func([]store.SlotSize, []byte) error { return nil }); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	return float64(reads) * float64(recordLen(key(0), 2, fioBlock)) / time.Since(t0).Seconds()
}

func fioEngine(b *testing.B) string {
	for _, e := range []string{"io_uring", "libaio"} {
		f := filepath.Join(b.TempDir(), "probe")
		if exec.Command("fio", "--name=p", "--filename="+f, "--size=1M", "--bs=4k", "--direct=1", "--ioengine="+e,
			"--rw=write").Run() == nil {
			return e
		}
	}
	b.Skip("fio runs with neither io_uring nor libaio here")
	return ""
}

// runFio runs fio on file (same file system as the tier's log) and
// returns its bandwidth in bytes per second. qd 0 is the mode's queue
// depth above (write 1, randread fioQD); a write with qd > 0 uses it.
func runFio(b *testing.B, engine, file, mode string, qd int) float64 {
	rec := recordLen(key(0), 2, fioBlock)
	size := fmt.Sprintf("--size=%d", fioBlocks*rec)
	args := []string{"--name=" + mode, "--filename=" + file, "--bs=" + fmt.Sprint(rec), size, "--direct=1",
		"--ioengine=" + engine, "--output-format=json", "--rw=" + mode}
	if mode == "write" {
		args = append(args, fmt.Sprintf("--iodepth=%d", max(qd, 1)))
	} else {
		// Lay the file out first (not timed), then the random reads.
		if out, err := exec.Command("fio", "--name=lay", "--filename="+file, "--bs="+fmt.Sprint(rec), size,
			"--direct=1", "--rw=write").CombinedOutput(); err != nil {
			b.Fatalf("fio layout: %v\n%s", err, out)
		}
		args = append(args, fmt.Sprintf("--iodepth=%d", fioQD), fmt.Sprintf("--io_size=%d", 4*fioBlocks*rec))
	}
	out, err := exec.Command("fio", args...).Output()
	if err != nil {
		b.Fatalf("fio %v: %v\n%s", args, err, out)
	}
	var res struct {
		Jobs []struct {
			Read, Write struct {
				BwBytes float64 `json:"bw_bytes"`
			}
		}
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) == 0 {
		b.Fatalf("fio output: %v\n%s", err, out)
	}
	if mode == "write" {
		return res.Jobs[0].Write.BwBytes
	}
	return res.Jobs[0].Read.BwBytes
}
