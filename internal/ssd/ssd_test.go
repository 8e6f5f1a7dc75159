package ssd

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func key(i int) store.Key { return store.Key{Namespace: "ns", Hash: fmt.Sprintf("h%05d", i)} }

func pattern(seed int, n uint64) []byte {
	b := make([]byte, n)
	x := uint32(seed)*2654435761 + 1
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = byte(x)
	}
	return b
}

type env struct {
	dirs []string
	m    *metrics.Tier
	o    Options
}

func newEnv(t *testing.T, npaths int, size, seg uint64) *env {
	t.Helper()
	e := &env{m: metricstest.NewTier()}
	for i := 0; i < npaths; i++ {
		e.dirs = append(e.dirs, filepath.Join(t.TempDir(), fmt.Sprintf("dev%d", i)))
	}
	e.o = Options{Paths: e.dirs, Size: size, SegmentSize: seg, Metrics: e.m, Log: zerolog.Nop()}
	return e
}

func (e *env) open(t *testing.T) *Tier {
	t.Helper()
	tr, err := Open(e.o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

var sizes2 = func(n uint64) []store.SlotSize {
	return []store.SlotSize{{KSize: n / 4, VSize: n / 4}, {KSize: n / 4, VSize: n - 3*(n/4)}}
}

// spill offers block i of n bytes and waits until it is written (or
// dropped).
func spill(t *testing.T, tr *Tier, i int, n uint64) {
	t.Helper()
	data := pattern(i, n)
	tr.Spill(key(i), sizes2(n), n, func(dst []byte) { copy(dst, data) })
	waitIdle(t, tr)
}

func waitIdle(t *testing.T, tr *Tier) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for tr.Stats().Queued > 0 {
		if time.Now().After(deadline) {
			t.Fatal("write queue never drained")
		}
		time.Sleep(time.Millisecond)
	}
}

// loadCopy is Load returning a copy of the block.
func loadCopy(tr *Tier, k store.Key) (sizes []store.SlotSize, data []byte, err error) {
	err = tr.Load(k, func(sz []store.SlotSize, d []byte) error {
		sizes, data = sz, append([]byte(nil), d...)
		return nil
	})
	return sizes, data, err
}

func mustLoad(t *testing.T, tr *Tier, i int, n uint64) {
	t.Helper()
	sz, data, err := loadCopy(tr, key(i))
	if err != nil {
		t.Fatalf("load %d: %v", i, err)
	}
	if !bytes.Equal(data, pattern(i, n)) {
		t.Fatalf("load %d: wrong bytes", i)
	}
	if fmt.Sprint(sz) != fmt.Sprint(sizes2(n)) {
		t.Fatalf("load %d: sizes %v, want %v", i, sz, sizes2(n))
	}
}

func TestRecordRoundTrip(t *testing.T) {
	for _, n := range []uint64{1 << 12, 5000, 1 << 20} {
		k := key(int(n))
		rec := alignedBuf(recordLen(k, 2, n))
		hl := headerLen(k, 2)
		copy(rec[hl:], pattern(1, n))
		encodeHeader(rec, 7, 9, k, sizes2(n), n)
		h, need, err := decodeHeader(rec[:Align])
		if err != nil || need != 0 || h.key != k || h.epoch != 7 || h.seq != 9 || h.dataLen != n {
			t.Fatalf("n=%d: decode = %+v need %d err %v", n, h, need, err)
		}
		if data, err := verify(rec, h); err != nil || !bytes.Equal(data, pattern(1, n)) {
			t.Fatalf("n=%d: verify: %v", n, err)
		}
		for _, at := range []uint64{3, 30, hl + n/2} { // a header byte, a CRC byte, a data byte
			bad := append([]byte(nil), rec...)
			bad[at] ^= 0x40
			h, _, err := decodeHeader(bad[:Align])
			if err == nil {
				_, err = verify(bad, h)
			}
			if err == nil {
				t.Fatalf("n=%d: byte %d flipped, record still valid", n, at)
			}
		}
	}
}

func TestSpillLoadAndRestart(t *testing.T) {
	for _, npaths := range []int{1, 2} {
		t.Run(fmt.Sprint(npaths, "paths"), func(t *testing.T) {
			e := newEnv(t, npaths, 16<<20, 0)
			tr := e.open(t)
			const n = 64 << 10
			for i := 0; i < 20; i++ {
				spill(t, tr, i, n)
			}
			for i := 0; i < 20; i++ {
				mustLoad(t, tr, i, n)
			}
			if st := tr.Stats(); st.Blocks != 20 || st.Bytes != 20*n {
				t.Fatalf("stats %+v", st)
			}
			if got := testutil.ToFloat64(e.m.Written); got != 20 {
				t.Fatalf("written %v", got)
			}
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			tr = e.open(t)
			for i := 0; i < 20; i++ {
				mustLoad(t, tr, i, n)
			}
			if got := testutil.ToFloat64(e.m.Recovered); got != 20 {
				t.Fatalf("recovered %v", got)
			}
			// Writing resumes after the recovered records.
			spill(t, tr, 100, n)
			mustLoad(t, tr, 100, n)
			mustLoad(t, tr, 0, n)
		})
	}
}

// TestRingAgesOut: a ring of 4 segments keeps the newest blocks; the
// oldest segment's are forgotten when the ring wraps, and a restart finds
// the same set.
func TestRingAgesOut(t *testing.T) {
	e := newEnv(t, 1, 4<<20, 1<<20)
	tr := e.open(t)
	const n = 200 << 10 // 5 records of 204 KiB per 1 MiB segment
	for i := 0; i < 40; i++ {
		spill(t, tr, i, n)
	}
	held := map[int]bool{}
	for i := 0; i < 40; i++ {
		held[i] = tr.Has(key(i))
	}
	for i := 36; i < 40; i++ { // the newest always survive
		if !held[i] {
			t.Fatalf("block %d (newest) aged out", i)
		}
	}
	if held[0] {
		t.Fatal("block 0 survived a ring that wrapped many times")
	}
	st := tr.Stats()
	if st.Blocks < 15 || st.Blocks > 20 {
		t.Fatalf("%d blocks held, want 15..20 (3 full segments of 5 and the one being written)", st.Blocks)
	}
	if aged := testutil.ToFloat64(e.m.AgedOut); aged != float64(40-st.Blocks) {
		t.Fatalf("aged out %v, want %d", aged, 40-st.Blocks)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	tr = e.open(t)
	for i := 0; i < 40; i++ {
		if tr.Has(key(i)) != held[i] {
			t.Fatalf("block %d: held %v before restart, %v after", i, held[i], tr.Has(key(i)))
		}
		if held[i] {
			mustLoad(t, tr, i, n)
		}
	}
}

// TestCorruptionNeverServed flips a byte of each of two records on disk:
// a data byte fails the record CRC at read, a header byte ends the scan
// at restart; neither is served.
func TestCorruptionNeverServed(t *testing.T) {
	e := newEnv(t, 1, 8<<20, 1<<20)
	tr := e.open(t)
	const n = 100 << 10
	for i := 0; i < 6; i++ {
		spill(t, tr, i, n)
	}
	locOf := func(i int) loc { tr.mu.Lock(); defer tr.mu.Unlock(); return tr.index[key(i)] }
	l1, l4 := locOf(1), locOf(4)
	flip(t, filepath.Join(e.dirs[0], LogName), l1.off+int64(l1.hdrLen)+5000)
	if _, _, err := loadCopy(tr, key(1)); !errors.Is(err, ErrChecksum) {
		t.Fatalf("corrupted block loaded: err %v", err)
	}
	if tr.Has(key(1)) || testutil.ToFloat64(e.m.ChecksumFailures) != 1 {
		t.Fatalf("corrupted block still held (%v) or not counted (%v)", tr.Has(key(1)), testutil.ToFloat64(e.m.ChecksumFailures))
	}
	mustLoad(t, tr, 2, n)
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	flip(t, filepath.Join(e.dirs[0], LogName), l4.off+20) // header
	tr = e.open(t)
	for i := 0; i < 6; i++ {
		_, _, err := loadCopy(tr, key(i))
		switch {
		case i == 1 && !errors.Is(err, ErrChecksum): // still bad on disk
			t.Fatalf("block 1 after restart: %v", err)
		case i >= 4 && !errors.Is(err, ErrNotFound): // the scan stopped at 4's header
			t.Fatalf("block %d after a bad header: %v", i, err)
		case i != 1 && i < 4 && err != nil:
			t.Fatalf("block %d: %v", i, err)
		}
	}
}

func flip(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, 1)
	if _, err := f.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	b[0] ^= 0xff
	if _, err := f.WriteAt(b, off); err != nil {
		t.Fatal(err)
	}
}

func TestDropsAreCounted(t *testing.T) {
	e := newEnv(t, 1, 4<<20, 1<<20)
	e.o.QueueBytes = 64 << 10
	tr := e.open(t)
	tr.Spill(key(1), sizes2(2<<20), 2<<20, func([]byte) { t.Fatal("too large a block copied") })
	tr.Spill(key(2), sizes2(100<<10), 100<<10, func([]byte) { t.Fatal("block over the queue bound copied") })
	if got := testutil.ToFloat64(e.m.Drops.WithLabelValues(metrics.SSDDropTooLarge)); got != 1 {
		t.Fatalf("too_large drops %v", got)
	}
	if got := testutil.ToFloat64(e.m.Drops.WithLabelValues(metrics.SSDDropQueueFull)); got != 1 {
		t.Fatalf("queue_full drops %v", got)
	}
	spill(t, tr, 3, 32<<10)
	mustLoad(t, tr, 3, 32<<10)
}

func TestForget(t *testing.T) {
	e := newEnv(t, 1, 4<<20, 1<<20)
	tr := e.open(t)
	spill(t, tr, 1, 8<<10)
	if !tr.Forget(key(1)) || tr.Has(key(1)) || tr.Forget(key(1)) {
		t.Fatal("forget did not drop the block exactly once")
	}
	if _, _, err := loadCopy(tr, key(1)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("forgotten block loaded: %v", err)
	}
}

func TestUnusablePaths(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]Options{
		"under a file": {Paths: []string{filepath.Join(file, "ssd")}, Size: 8 << 20},
		"too small":    {Paths: []string{dir}, Size: 1 << 20},
		"no path":      {Size: 8 << 20},
	} {
		if _, err := Open(o); !errors.Is(err, ErrUnusable) {
			t.Errorf("%s: err %v, want ErrUnusable", name, err)
		}
	}
	o := Options{Paths: []string{dir}, Size: 8 << 20, Log: zerolog.Nop()}
	tr, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, err := Open(o); !errors.Is(err, ErrUnusable) {
		t.Fatalf("second open of a path in use: %v", err)
	}
}

// TestPage lists the tier newest first, page by page, skipping what the
// caller holds, with every block once.
func TestPage(t *testing.T) {
	e := newEnv(t, 1, 8<<20, 0)
	tr := e.open(t)
	for i := 0; i < 10; i++ {
		spill(t, tr, i, 8<<10)
	}
	skip := func(k store.Key) bool { return k == key(5) }
	var got []string
	before := uint64(0)
	for pages := 0; ; pages++ {
		entries, next := tr.Page("ns", before, 3, skip)
		for _, en := range entries {
			got = append(got, en.Key.Hash)
			if en.Size != 8<<10 || len(en.Slots) != 2 {
				t.Fatalf("entry %+v", en)
			}
		}
		if next == 0 {
			break
		}
		if pages > 10 {
			t.Fatal("paging never ends")
		}
		before = next
	}
	want := []string{}
	for i := 9; i >= 0; i-- {
		if i != 5 {
			want = append(want, key(i).Hash)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("listed %v, want %v", got, want)
	}
	if entries, _ := tr.Page("other", 0, 3, nil); len(entries) != 0 {
		t.Fatalf("namespace filter: %v", entries)
	}
}
