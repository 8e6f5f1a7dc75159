package store

import (
	"bytes"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/pegaflow/pegad/api/limits"
	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/pool"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// Any ref underflow in any test is a bug in the store or the test:
	// fail loudly. TestUnderflowIgnored swaps in a recorder.
	underflowHook = func(what string) { panic("store ref underflow: " + what) }
	goleak.VerifyTestMain(m)
}

const kib = 1 << 10

func newStore(t testing.TB, size uint64) (*Store, *metrics.Metrics) {
	t.Helper()
	return newPolicyStoreSized(t, evict.KindLRU, size) // New's policy
}

func key(i int) Key { return Key{Namespace: "ns", Hash: fmt.Sprintf("h%04d", i)} }

// pattern is the deterministic content of block seed, n bytes.
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

func total(sizes []SlotSize) uint64 {
	var n uint64
	for _, s := range sizes {
		n += s.KSize + s.VSize
	}
	return n
}

func mustPut(t testing.TB, s *Store, k Key, seed int, sizes ...SlotSize) {
	t.Helper()
	want := pattern(seed, total(sizes))
	created, err := s.Put(k, sizes, func(buf []byte) error {
		if uint64(len(buf)) != uint64(len(want)) {
			return fmt.Errorf("fill buffer %d bytes, want %d", len(buf), len(want))
		}
		copy(buf, want)
		return nil
	})
	if err != nil || !created {
		t.Fatalf("Put(%v) = %v, %v", k, created, err)
	}
}

func readAll(t testing.TB, s *Store, k Key) ([]byte, Info) {
	t.Helper()
	var got []byte
	info, err := s.Read(k, func(c []byte) error {
		if len(c) > ReadChunk || len(c) == 0 {
			return fmt.Errorf("chunk of %d bytes", len(c))
		}
		got = append(got, c...)
		return nil
	})
	if err != nil {
		t.Fatalf("Read(%v): %v", k, err)
	}
	return got, info
}

// blockBytes reads the block's memory straight from its segments (as an
// RDMA READ would), without Read's pin.
func blockBytes(b *Block) []byte {
	var out []byte
	for _, sl := range b.slots {
		for _, seg := range []Segment{sl.K, sl.V} {
			if seg.Len == 0 {
				continue
			}
			o := seg.Off - b.ext.alloc.Off
			out = append(out, b.ext.mem[o:o+seg.Len]...)
		}
	}
	return out
}

func indexedKeys(s *Store) map[Key]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := map[Key]bool{}
	for k := range s.index.all() {
		m[k] = true
	}
	return m
}

func TestPutReadByteIdentical(t *testing.T) {
	s, _ := newStore(t, 16<<20)
	tests := []struct {
		name  string
		sizes []SlotSize
	}{
		{"one K", []SlotSize{{KSize: 1}}},
		{"K and V", []SlotSize{{KSize: 4 * kib, VSize: 4 * kib}}},
		{"odd sizes", []SlotSize{{KSize: 1000, VSize: 3}, {KSize: 77}}},
		{"tp8", []SlotSize{{64 * kib, 64 * kib}, {64 * kib, 64 * kib}, {64 * kib, 64 * kib}, {64 * kib, 64 * kib},
			{64 * kib, 64 * kib}, {64 * kib, 64 * kib}, {64 * kib, 64 * kib}, {64 * kib, 64 * kib}}},
		{"multi-MiB chunks", []SlotSize{{KSize: 3<<20 + 5, VSize: 2 << 20}}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k := key(i)
			mustPut(t, s, k, i, tt.sizes...)
			got, info := readAll(t, s, k)
			if !bytes.Equal(got, pattern(i, total(tt.sizes))) {
				t.Fatal("read bytes differ from put bytes")
			}
			if info.Size != total(tt.sizes) || len(info.Slots) != len(tt.sizes) || info.Key != k {
				t.Fatalf("info %+v", info)
			}
			for j, sz := range tt.sizes {
				if info.Slots[j] != sz {
					t.Fatalf("slot %d shape %+v, want %+v", j, info.Slots[j], sz)
				}
			}
			pinned, missing := s.Pin([]Key{k})
			defer s.Unpin(pinned)
			if len(missing) != 0 {
				t.Fatal("missing")
			}
			b := pinned[0]
			for j, sl := range b.Slots() {
				if sl.K.Addr != s.Pool().Base()+sl.K.Off || sl.K.Len != tt.sizes[j].KSize || sl.V.Len != tt.sizes[j].VSize {
					t.Fatalf("slot %d segments %+v", j, sl)
				}
			}
			if !bytes.Equal(blockBytes(b), got) {
				t.Fatal("segments do not hold the block's bytes")
			}
		})
	}
	if _, err := s.Read(key(99), func([]byte) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Read missing: %v", err)
	}
	boom := errors.New("boom")
	if _, err := s.Read(key(0), func([]byte) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Read callback error: %v", err)
	}
	if st := s.Stats(); st.Pinned != 0 {
		t.Fatalf("Read left pins: %+v", st)
	}
}

func TestPutValidation(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	long := strings.Repeat("x", limits.MaxNamespaceLen+1)
	tests := []struct {
		name  string
		k     Key
		sizes []SlotSize
		want  error
	}{
		{"empty namespace", Key{Hash: "h"}, []SlotSize{{KSize: 1}}, limits.ErrInvalidKey},
		{"long namespace", Key{Namespace: long, Hash: "h"}, []SlotSize{{KSize: 1}}, limits.ErrInvalidKey},
		{"empty hash", Key{Namespace: "ns"}, []SlotSize{{KSize: 1}}, limits.ErrInvalidKey},
		{"long hash", Key{Namespace: "ns", Hash: strings.Repeat("h", limits.MaxHashLen+1)}, []SlotSize{{KSize: 1}}, limits.ErrInvalidKey},
		{"no slots", key(1), nil, ErrInvalid},
		{"too many slots", key(1), make([]SlotSize, MaxSlots+1), ErrInvalid},
		{"zero K", key(1), []SlotSize{{KSize: 0, VSize: 10}}, ErrInvalid},
		{"huge", key(1), []SlotSize{{KSize: MaxBlockLen, VSize: 1}}, ErrInvalid},
		{"larger than pool", key(1), []SlotSize{{KSize: 2 << 20}}, ErrNoSpace},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := s.Stats()
			_, err := s.Put(tt.k, tt.sizes, func([]byte) error { t.Fatal("fill called"); return nil })
			if !errors.Is(err, tt.want) || (errors.Is(tt.want, limits.ErrInvalidKey) && !errors.Is(err, ErrInvalid)) {
				t.Fatalf("err %v, want %v", err, tt.want)
			}
			if after := s.Stats(); after != before {
				t.Fatalf("state changed %+v -> %+v", before, after)
			}
		})
	}
}

func TestInsertValidation(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	other, _ := newStore(t, 1<<20)
	e, err := s.AllocExtent(4 * kib)
	if err != nil {
		t.Fatal(err)
	}
	defer s.ReleaseExtent(e)
	foreign, err := other.AllocExtent(4 * kib)
	if err != nil {
		t.Fatal(err)
	}
	defer other.ReleaseExtent(foreign)
	released, err := s.AllocExtent(4 * kib)
	if err != nil {
		t.Fatal(err)
	}
	s.ReleaseExtent(released)
	ok := []SlotLayout{{KOff: 0, KLen: 100}}
	tests := []struct {
		name   string
		k      Key
		e      *Extent
		layout []SlotLayout
		reason string
	}{
		{"empty namespace", Key{Hash: "h"}, e, ok, "namespace is empty"},
		{"long hash", Key{Namespace: "ns", Hash: strings.Repeat("h", 65)}, e, ok, "hash is 65 bytes"},
		{"nil extent", key(1), nil, ok, "extent"},
		{"foreign extent", key(1), foreign, ok, "extent"},
		{"released extent", key(1), released, ok, "released"},
		{"no slots", key(1), e, nil, "0 slots"},
		{"zero K", key(1), e, []SlotLayout{{KOff: 0, KLen: 0}}, "empty K"},
		{"K past end", key(1), e, []SlotLayout{{KOff: 4*kib - 10, KLen: 11}}, "outside"},
		{"V past end", key(1), e, []SlotLayout{{KOff: 0, KLen: 1, VOff: 4 * kib, VLen: 1}}, "outside"},
		{"offset overflow", key(1), e, []SlotLayout{{KOff: ^uint64(0) - 1, KLen: 4}}, "outside"},
		{"second slot bad", key(1), e, []SlotLayout{{KLen: 1}, {KOff: 5000, KLen: 1}}, "slot 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := s.Stats()
			created, err := s.Insert(tt.k, tt.e, tt.layout)
			if !errors.Is(err, ErrInvalid) || created || !strings.Contains(err.Error(), tt.reason) {
				t.Fatalf("Insert = %v, %v; want ErrInvalid mentioning %q", created, err, tt.reason)
			}
			if after := s.Stats(); after != before {
				t.Fatalf("state changed")
			}
		})
	}
	// A valid layout using the extent's rounded tail works.
	if created, err := s.Insert(key(1), e, []SlotLayout{{KOff: 0, KLen: 2 * kib, VOff: 2 * kib, VLen: 2 * kib}}); err != nil || !created {
		t.Fatalf("valid insert: %v %v", created, err)
	}
	if deferred, err := s.Delete(key(1)); err != nil || deferred {
		t.Fatal(err)
	}
}

func TestDuplicateInsert(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	mustPut(t, s, key(1), 1, SlotSize{KSize: 1000})
	before := s.Stats()
	created, err := s.Put(key(1), []SlotSize{{KSize: 2000}}, func([]byte) error {
		t.Fatal("fill called for an existing key")
		return nil
	})
	if err != nil || created {
		t.Fatalf("duplicate Put = %v, %v", created, err)
	}
	// Insert of an existing key into another extent changes nothing, and
	// the other extent frees on its caller's release.
	e, err := s.AllocExtent(4 * kib)
	if err != nil {
		t.Fatal(err)
	}
	created, err = s.Insert(key(1), e, []SlotLayout{{KLen: 10}})
	if err != nil || created {
		t.Fatalf("duplicate Insert = %v, %v", created, err)
	}
	s.ReleaseExtent(e)
	if after := s.Stats(); after != before {
		t.Fatalf("duplicate changed state: %+v -> %+v", before, after)
	}
	got, info := readAll(t, s, key(1))
	if !bytes.Equal(got, pattern(1, 1000)) || info.Size != 1000 {
		t.Fatal("original block replaced")
	}
}

func TestFillErrorStoresNothing(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	mustPut(t, s, key(0), 0, SlotSize{KSize: 100})
	before := s.Stats()
	boom := errors.New("client went away")
	_, err := s.Put(key(1), []SlotSize{{KSize: 64 * kib}}, func(buf []byte) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("err %v", err)
	}
	if s.Has(key(1)) || s.Stats() != before {
		t.Fatalf("fill error left state: %+v -> %+v", before, s.Stats())
	}
}

func TestLRUEvictionOrder(t *testing.T) {
	s, m := newStore(t, 1<<20)
	const bs = 64 * kib // 16 blocks fill the pool exactly
	for i := 0; i < 16; i++ {
		mustPut(t, s, key(i), i, SlotSize{KSize: bs})
	}
	if st := s.Stats(); st.Pool.Free != 0 {
		t.Fatalf("pool not full: %+v", st.Pool)
	}
	// Touch 0..3 (Read and Pin both count); LRU order is now 4,5,...,15,0,1,2,3.
	for i := 0; i < 4; i++ {
		if i%2 == 0 {
			readAll(t, s, key(i))
		} else {
			b, _ := s.Pin([]Key{key(i)})
			s.Unpin(b)
		}
	}
	// Has and the prefix lookups must not touch.
	s.Has(key(4))
	if n := s.Prefix([]Key{key(4), key(5), key(6)}); n != 3 {
		t.Fatalf("Prefix = %d, want 3", n)
	}
	if n := s.PrefixOf("ns", [][]byte{[]byte(key(4).Hash), []byte(key(5).Hash), []byte("none"), []byte(key(6).Hash)}); n != 2 {
		t.Fatalf("PrefixOf = %d, want 2", n)
	}
	for i := 16; i < 22; i++ {
		mustPut(t, s, key(i), i, SlotSize{KSize: bs})
		gone := key(i - 12) // 4, 5, 6, ...
		if s.Has(gone) {
			t.Fatalf("after put %d, %v (least recent) still indexed", i, gone)
		}
	}
	have := indexedKeys(s)
	for i := 0; i < 22; i++ {
		want := !(i >= 4 && i < 10)
		if have[key(i)] != want {
			t.Errorf("block %d indexed %v, want %v", i, have[key(i)], want)
		}
	}
	st := s.Stats()
	if st.Evictions != 6 || st.Blocks != 16 || metrics.Value(m.Evictions) != 6 || metrics.Value(m.Blocks) != 16 {
		t.Fatalf("stats %+v, metric evictions %v", st, metrics.Value(m.Evictions))
	}
	for i := 0; i < 22; i++ {
		if have[key(i)] {
			if got, _ := readAll(t, s, key(i)); !bytes.Equal(got, pattern(i, bs)) {
				t.Fatalf("block %d corrupted", i)
			}
		}
	}
	// List: most recently used first, limit, truncated, namespace filter.
	infos, trunc := s.List("", 3)
	if !trunc || len(infos) != 3 || infos[0].Key != key(21) || infos[1].Key != key(20) || infos[2].Key != key(19) {
		t.Fatalf("List = %v %+v", trunc, infos)
	}
	if infos, trunc := s.List("other", 0); len(infos) != 0 || trunc {
		t.Fatalf("List(other) = %+v", infos)
	}
	if infos, trunc := s.List("ns", 0); len(infos) != 16 || trunc {
		t.Fatalf("List(ns) = %d %v", len(infos), trunc)
	}
}

// TestEvictOnlyWhatIsNeeded: a 128 KiB request evicts the LRU prefix up to
// the first point where a contiguous 128 KiB range exists, and no further.
func TestEvictOnlyWhatIsNeeded(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	const bs = 64 * kib
	for i := 0; i < 16; i++ {
		mustPut(t, s, key(i), i, SlotSize{KSize: bs}) // block i at offset i*64K
	}
	// LRU from least recent: 0, 5, 1, then the rest. Evicting 0 and 5 frees
	// two separate 64K holes; evicting 1 joins 0+1 into 128K.
	var order []int
	order = append(order, 2, 3, 4)
	for i := 6; i < 16; i++ {
		order = append(order, i)
	}
	s.mu.Lock()
	for _, i := range []int{1, 5, 0} {
		demoteLocked(s, key(i))
	}
	s.mu.Unlock()
	mustPut(t, s, key(100), 100, SlotSize{KSize: 2 * bs})
	have := indexedKeys(s)
	for _, i := range []int{0, 1, 5} {
		if have[key(i)] {
			t.Errorf("block %d should have been evicted", i)
		}
	}
	for _, i := range order {
		if !have[key(i)] {
			t.Errorf("block %d evicted beyond need", i)
		}
	}
	if st := s.Stats(); st.Evictions != 3 {
		t.Fatalf("evictions %d, want 3", st.Evictions)
	}
}

func TestNoFitStoresNothing(t *testing.T) {
	const bs = 64 * kib
	t.Run("everything pinned", func(t *testing.T) {
		s, _ := newStore(t, 1<<20)
		for i := 0; i < 16; i++ {
			mustPut(t, s, key(i), i, SlotSize{KSize: bs})
		}
		var keys []Key
		for i := 0; i < 16; i++ {
			keys = append(keys, key(i))
		}
		pinned, _ := s.Pin(keys)
		defer s.Unpin(pinned)
		before := s.Stats()
		_, err := s.Put(key(99), []SlotSize{{KSize: 100}}, func([]byte) error { t.Fatal("fill called"); return nil })
		if !errors.Is(err, ErrNoSpace) {
			t.Fatalf("err %v", err)
		}
		if after := s.Stats(); after != before || s.Has(key(99)) {
			t.Fatalf("state changed: %+v -> %+v", before, after)
		}
	})
	t.Run("fragmented by pins", func(t *testing.T) {
		s, _ := newStore(t, 1<<20)
		for i := 0; i < 16; i++ {
			mustPut(t, s, key(i), i, SlotSize{KSize: bs})
		}
		// Pin every other block: evicting all unpinned ones frees 512K,
		// but never 128K contiguous. Nothing may be evicted.
		var keys []Key
		for i := 0; i < 16; i += 2 {
			keys = append(keys, key(i))
		}
		pinned, _ := s.Pin(keys)
		defer s.Unpin(pinned)
		before := s.Stats()
		if _, err := s.AllocExtent(2 * bs); !errors.Is(err, ErrNoSpace) {
			t.Fatalf("err %v", err)
		}
		if after := s.Stats(); after != before {
			t.Fatalf("state changed: %+v -> %+v", before, after)
		}
		// 64K fits by evicting exactly one (the least recent unpinned: 1).
		e, err := s.AllocExtent(bs)
		if err != nil {
			t.Fatal(err)
		}
		defer s.ReleaseExtent(e)
		if s.Has(key(1)) || !s.Has(key(3)) || s.Stats().Evictions != 1 {
			t.Fatalf("expected exactly block 1 evicted: %+v", s.Stats())
		}
	})
}

// allocsLive lists the pool allocations of every live extent the store
// knows through indexed blocks plus the extra ones given.
func allocsLive(s *Store, extra ...*Extent) []pool.Alloc {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[*Extent]bool{}
	var out []pool.Alloc
	add := func(e *Extent) {
		if !seen[e] {
			seen[e] = true
			out = append(out, e.alloc)
		}
	}
	for _, e := range extra {
		add(e)
	}
	for _, b := range s.index.all() {
		add(b.ext)
	}
	return out
}

// checkDisjoint checks that the store's live extents never overlap, and
// (quiescent store, no other pool users) that they are exactly what the pool
// counts as used: a pinned extent's range is still allocated, not free.
func checkDisjoint(t *testing.T, s *Store, as []pool.Alloc) {
	t.Helper()
	var sum uint64
	for _, a := range as {
		sum += a.Len
	}
	if u := s.Pool().Used(); u != sum {
		t.Fatalf("pool used %d, live extents %d", u, sum)
	}
	sort.Slice(as, func(i, j int) bool { return as[i].Off < as[j].Off })
	for i := 1; i < len(as); i++ {
		if as[i-1].Off+as[i-1].Len > as[i].Off {
			t.Fatalf("allocations overlap: %+v and %+v", as[i-1], as[i])
		}
	}
}

func TestPinnedNeverEvictedAndReused(t *testing.T) {
	s, m := newStore(t, 1<<20)
	const bs = 64 * kib
	mustPut(t, s, key(0), 0, SlotSize{KSize: bs / 2, VSize: bs / 2})
	pinned, _ := s.Pin([]Key{key(0)})
	x := pinned[0]
	want := pattern(0, bs)
	// Heavy pressure: 10x the pool, which evicts x from the index (it is
	// the least recent) but must not reuse its memory.
	for i := 1; i < 160; i++ {
		mustPut(t, s, key(i), i, SlotSize{KSize: bs})
		if i%16 == 0 {
			checkDisjoint(t, s, allocsLive(s, x.ext))
		}
	}
	if !bytes.Equal(blockBytes(x), want) {
		t.Fatal("pinned block's bytes changed under eviction pressure")
	}
	if x.Pins() != 1 {
		t.Fatalf("pins %d", x.Pins())
	}
	st := s.Stats()
	// x stayed indexed (pinned blocks are skipped by the LRU), and 15 blocks
	// fit beside it.
	if !s.Has(key(0)) || st.Blocks != 16 || st.Pinned != 1 {
		t.Fatalf("stats %+v", st)
	}
	// Now delete it while pinned: deferred, memory kept, still not reused.
	deferred, err := s.Delete(key(0))
	if err != nil || !deferred {
		t.Fatalf("Delete = %v, %v", deferred, err)
	}
	if st := s.Stats(); st.DeferredFree != 1 || metrics.Value(m.PinnedDeferred) != 1 {
		t.Fatalf("deferred stats %+v", st)
	}
	for i := 160; i < 200; i++ {
		mustPut(t, s, key(i), i, SlotSize{KSize: bs})
	}
	checkDisjoint(t, s, allocsLive(s, x.ext))
	if !bytes.Equal(blockBytes(x), want) {
		t.Fatal("deleted-but-pinned block's bytes changed")
	}
	s.Unpin(pinned)
	if st := s.Stats(); st.DeferredFree != 0 || st.Pinned != 0 || metrics.Value(m.PinnedDeferred) != 0 {
		t.Fatalf("after unpin %+v", st)
	}
	// Its memory is now reusable: one more put fits without eviction.
	ev := s.Stats().Evictions
	mustPut(t, s, key(500), 500, SlotSize{KSize: bs})
	if s.Stats().Evictions != ev {
		t.Fatal("freed pinned memory was not returned to the pool")
	}
}

// TestLeftIndexWhilePinnedFreesOnLastUnpin: the LRU never evicts a pinned
// block (that would free nothing), so a pinned block leaves the index only
// by Delete; its memory stays until the last of its pins goes.
func TestLeftIndexWhilePinnedFreesOnLastUnpin(t *testing.T) {
	s, m := newStore(t, 1<<20)
	const bs = 64 * kib
	base := s.Pool().Stats().Used
	mustPut(t, s, key(0), 0, SlotSize{KSize: bs})
	p1, _ := s.Pin([]Key{key(0)})
	p2, _ := s.Pin([]Key{key(0)}) // two sessions
	if p1[0] != p2[0] || p1[0].Pins() != 2 {
		t.Fatal("two pins of one block")
	}
	if deferred, err := s.Delete(key(0)); err != nil || !deferred {
		t.Fatalf("Delete = %v, %v", deferred, err)
	}
	if got := s.Pool().Stats().Used; got != base+bs {
		t.Fatalf("used %d, want %d while pinned", got, base+bs)
	}
	s.Unpin(p1)
	if got := s.Pool().Stats().Used; got != base+bs {
		t.Fatalf("freed on first of two unpins (used %d)", got)
	}
	s.Unpin(p2)
	if got := s.Pool().Stats().Used; got != base {
		t.Fatalf("used %d after last unpin, want baseline %d", got, base)
	}
	if metrics.Value(m.PoolUsed) != float64(base) {
		t.Fatalf("PoolUsed metric %v", metrics.Value(m.PoolUsed))
	}
	if _, err := s.Delete(key(0)); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Delete: %v", err)
	}
}

func TestSharedExtentFreedByLastBlock(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	const bs = 64 * kib
	// A prefetch: one 256K extent holding 4 blocks.
	e, err := s.AllocExtent(4 * bs)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		copy(e.Bytes()[uint64(i)*bs:], pattern(i, bs))
		if created, err := s.Insert(key(i), e, []SlotLayout{{KOff: uint64(i) * bs, KLen: bs}}); err != nil || !created {
			t.Fatal(err)
		}
	}
	s.ReleaseExtent(e)
	for i := 0; i < 4; i++ {
		if got, _ := readAll(t, s, key(i)); !bytes.Equal(got, pattern(i, bs)) {
			t.Fatalf("block %d in shared extent corrupted", i)
		}
	}
	// Deleting three frees nothing.
	for i := 0; i < 3; i++ {
		if _, err := s.Delete(key(i)); err != nil {
			t.Fatal(err)
		}
		if u := s.Pool().Stats().Used; u != 4*bs {
			t.Fatalf("extent freed early: used %d after deleting %d blocks", u, i+1)
		}
	}
	if _, err := s.Delete(key(3)); err != nil {
		t.Fatal(err)
	}
	if u := s.Pool().Stats().Used; u != 0 {
		t.Fatalf("used %d after last block of the extent went", u)
	}

	// Eviction amplification: a 64K put in a full pool evicts every block
	// of the shared extent (it is the LRU's oldest memory), and no more.
	e, err = s.AllocExtent(4 * bs)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 4; i++ {
		if _, err := s.Insert(key(i), e, []SlotLayout{{KOff: uint64(i) * bs, KLen: bs}}); err != nil {
			t.Fatal(err)
		}
	}
	s.ReleaseExtent(e)
	for i := 10; i < 22; i++ {
		mustPut(t, s, key(i), i, SlotSize{KSize: bs})
	}
	// One block of the shared extent is recently used: the other three are
	// the LRU's oldest, but evicting them frees nothing while it lives.
	readAll(t, s, key(2))
	pinned, _ := s.Pin([]Key{key(2)})
	mustPut(t, s, key(30), 30, SlotSize{KSize: bs})
	have := indexedKeys(s)
	for i := 0; i < 4; i++ {
		if !have[key(i)] {
			t.Errorf("block %d of a pinned extent evicted for nothing", i)
		}
	}
	if have[key(10)] || !have[key(11)] || s.Stats().Evictions != 1 {
		t.Fatalf("want exactly block 10 evicted; evictions %d", s.Stats().Evictions)
	}
	s.Unpin(pinned)
	// Unpinned, and block 2 made least recent: the next put evicts all four.
	s.mu.Lock()
	demoteLocked(s, key(2))
	s.mu.Unlock()
	mustPut(t, s, key(31), 31, SlotSize{KSize: bs})
	have = indexedKeys(s)
	for i := 0; i < 4; i++ {
		if have[key(i)] {
			t.Errorf("block %d of the freed extent still indexed", i)
		}
	}
	if ev := s.Stats().Evictions; ev != 5 {
		t.Fatalf("evictions %d, want 5 (1 + the extent's 4)", ev)
	}
	if s.Pool().Stats().Used != 13*bs {
		t.Fatalf("used %d", s.Pool().Stats().Used)
	}
}

func TestAllocExtentHeldByCallerIsNotEvictable(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	const bs = 64 * kib
	// A staging extent still owned by its fetch, with one block already
	// indexed in it: evicting the block cannot free the extent.
	e, err := s.AllocExtent(8 * bs)
	if err != nil {
		t.Fatal(err)
	}
	defer s.ReleaseExtent(e)
	if _, err := s.Insert(key(0), e, []SlotLayout{{KLen: bs}}); err != nil {
		t.Fatal(err)
	}
	before := s.Stats()
	if _, err := s.AllocExtent(9 * bs); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("err %v", err)
	}
	if after := s.Stats(); after != before {
		t.Fatal("evicted a block of an extent its allocator still holds")
	}
}

func TestUnderflowIgnored(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	var got []string
	old := underflowHook
	underflowHook = func(what string) { got = append(got, what) }
	t.Cleanup(func() { underflowHook = old })

	mustPut(t, s, key(0), 0, SlotSize{KSize: 100})
	pinned, _ := s.Pin([]Key{key(0)})
	s.Unpin(pinned)
	s.Unpin(pinned) // one too many
	e, err := s.AllocExtent(64)
	if err != nil {
		t.Fatal(err)
	}
	s.ReleaseExtent(e)
	s.ReleaseExtent(e) // one too many
	st := s.Stats()
	if len(got) != 2 || st.RefUnderflows != 2 {
		t.Fatalf("underflows %v, stats %+v", got, st)
	}
	if pinned[0].Pins() != 0 || st.Pinned != 0 || st.Blocks != 1 || st.Pool.Used != 128 {
		t.Fatalf("state corrupted by underflow: %+v", st)
	}
	// The block is still evictable and deletable normally.
	if deferred, err := s.Delete(key(0)); err != nil || deferred {
		t.Fatal(err)
	}
	if s.Pool().Stats().Used != 0 {
		t.Fatal("memory not freed")
	}
}

// demoteLocked makes k's block the LRU policy's next victim (and the
// listing order's oldest).
func demoteLocked(s *Store, k Key) {
	b := s.index.get(k)
	s.lru.MoveToBack(b.elem)
	s.policy.(*evict.LRU).Demote(&b.node)
}
