package pool

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

func newPool(t testing.TB, size uint64) *Pool {
	t.Helper()
	p, err := New(Options{Size: size, Log: zerolog.Nop()})
	if err != nil {
		t.Fatalf("New(%d): %v", size, err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// checkModel verifies the pool against the set of allocations the test holds:
// no two overlap, all are inside the pool and aligned, and the totals agree.
func checkModel(t *testing.T, p *Pool, live map[uint64]Alloc) {
	t.Helper()
	as := make([]Alloc, 0, len(live))
	var used uint64
	for _, a := range live {
		as = append(as, a)
		used += a.Len
	}
	sort.Slice(as, func(i, j int) bool { return as[i].Off < as[j].Off })
	for i, a := range as {
		if a.Off%Alignment != 0 || a.Len%Alignment != 0 {
			t.Fatalf("unaligned %+v", a)
		}
		if a.Off+a.Len > p.Size() {
			t.Fatalf("%+v outside pool of %d", a, p.Size())
		}
		if i > 0 && as[i-1].Off+as[i-1].Len > a.Off {
			t.Fatalf("overlap: %+v and %+v", as[i-1], a)
		}
	}
	s := p.Stats()
	if s.Used != used || s.Allocs != len(live) || s.Free != s.Size-used || s.LargestFree > s.Free {
		t.Fatalf("stats %+v, model used=%d allocs=%d", s, used, len(live))
	}
	// The free list must be sorted, disjoint, coalesced, and exactly the
	// complement of the live allocations.
	p.mu.Lock()
	defer p.mu.Unlock()
	var freeSum uint64
	for i, f := range p.free {
		if f.len == 0 || (i > 0 && p.free[i-1].off+p.free[i-1].len >= f.off) {
			t.Fatalf("free list not sorted/coalesced at %d: %v", i, p.free)
		}
		freeSum += f.len
	}
	if freeSum+used != p.size {
		t.Fatalf("free %d + used %d != size %d", freeSum, used, p.size)
	}
}

func TestNewRoundsAndRejects(t *testing.T) {
	page := uint64(unix.Getpagesize())
	tests := []struct {
		name string
		size uint64
		want uint64
		err  error
	}{
		{"zero", 0, 0, ErrInvalid},
		{"one byte", 1, page, nil},
		{"page", page, page, nil},
		{"page+1", page + 1, 2 * page, nil},
		{"16MiB", 16 << 20, 16 << 20, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := New(Options{Size: tt.size, Log: zerolog.Nop()})
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("err = %v, want %v", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if p.Size() != tt.want || uint64(len(p.Bytes())) != tt.want {
				t.Fatalf("size %d / len %d, want %d", p.Size(), len(p.Bytes()), tt.want)
			}
			if s := p.Stats(); s.LargestFree != tt.want || s.Used != 0 {
				t.Fatalf("fresh stats %+v", s)
			}
		})
	}
}

func TestAllocInvalid(t *testing.T) {
	p := newPool(t, 1<<20)
	for _, n := range []uint64{0, p.Size() + 1, ^uint64(0)} {
		if _, err := p.Alloc(n); !errors.Is(err, ErrInvalid) {
			t.Errorf("Alloc(%d) err = %v, want ErrInvalid", n, err)
		}
	}
	a, err := p.Alloc(1)
	if err != nil || a.Len != Alignment {
		t.Fatalf("Alloc(1) = %+v, %v; want len %d", a, err, Alignment)
	}
}

func TestRandomAgainstModel(t *testing.T) {
	p := newPool(t, 4<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	live := map[uint64]Alloc{}
	var noSpace int
	for i := 0; i < 20000; i++ {
		if len(live) > 0 && rng.IntN(100) < 45 {
			// Free a random live allocation.
			var victim Alloc
			k := rng.IntN(len(live))
			for _, a := range live {
				if k == 0 {
					victim = a
					break
				}
				k--
			}
			if err := p.Free(victim); err != nil {
				t.Fatalf("Free(%+v): %v", victim, err)
			}
			delete(live, victim.Off)
		} else {
			n := uint64(rng.IntN(64<<10)) + 1
			if rng.IntN(20) == 0 {
				n = uint64(rng.IntN(1<<20)) + 1
			}
			before := p.Stats()
			a, err := p.Alloc(n)
			if errors.Is(err, ErrNoSpace) {
				noSpace++
				if before.LargestFree >= roundUp(n) {
					t.Fatalf("ErrNoSpace for %d with LargestFree %d", n, before.LargestFree)
				}
				continue
			}
			if err != nil {
				t.Fatalf("Alloc(%d): %v", n, err)
			}
			if a.Len != roundUp(n) {
				t.Fatalf("Alloc(%d) len %d", n, a.Len)
			}
			if _, dup := live[a.Off]; dup {
				t.Fatalf("offset %d handed out twice", a.Off)
			}
			live[a.Off] = a
		}
		if i%97 == 0 {
			checkModel(t, p, live)
		}
	}
	checkModel(t, p, live)
	if noSpace == 0 {
		t.Fatal("random run never hit ErrNoSpace: the model did not exercise exhaustion")
	}
	for _, a := range live {
		if err := p.Free(a); err != nil {
			t.Fatal(err)
		}
	}
	clear(live)
	checkModel(t, p, live)
	if s := p.Stats(); s.LargestFree != p.Size() || s.Used != 0 {
		t.Fatalf("after freeing everything: %+v", s)
	}
}

func TestExhaustThenNoSpaceThenCoalesce(t *testing.T) {
	p := newPool(t, 1<<20)
	const n = 4096
	var as []Alloc
	for {
		a, err := p.Alloc(n)
		if errors.Is(err, ErrNoSpace) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		as = append(as, a)
	}
	if uint64(len(as)) != p.Size()/n {
		t.Fatalf("got %d allocs, want %d", len(as), p.Size()/n)
	}
	if s := p.Stats(); s.Free != 0 || s.LargestFree != 0 {
		t.Fatalf("exhausted stats %+v", s)
	}
	if _, err := p.Alloc(Alignment); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("err %v, want ErrNoSpace", err)
	}
	// Free every other one: free bytes are half the pool but fragmented.
	for i := 0; i < len(as); i += 2 {
		if err := p.Free(as[i]); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.Stats(); s.Free != p.Size()/2 || s.LargestFree != n {
		t.Fatalf("fragmented stats %+v", s)
	}
	if _, err := p.Alloc(2 * n); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("fragmented Alloc(2n) err %v, want ErrNoSpace", err)
	}
	// Free the rest in an order that exercises left, right and both merges.
	rng := rand.New(rand.NewPCG(3, 4))
	odd := []Alloc{}
	for i := 1; i < len(as); i += 2 {
		odd = append(odd, as[i])
	}
	rng.Shuffle(len(odd), func(i, j int) { odd[i], odd[j] = odd[j], odd[i] })
	for _, a := range odd {
		if err := p.Free(a); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.Stats(); s.LargestFree != p.Size() || s.Used != 0 || s.Allocs != 0 {
		t.Fatalf("after coalescing %+v", s)
	}
	if len(p.free) != 1 {
		t.Fatalf("free list %v, want one range", p.free)
	}
}

// TestNoSpaceAllocatesNothing: a full pool answers every allocation (the
// store's fast path tries one before each eviction) without building an
// error value.
func TestNoSpaceAllocatesNothing(t *testing.T) {
	p := newPool(t, 1<<20)
	if _, err := p.Alloc(p.Size()); err != nil {
		t.Fatal(err)
	}
	var err error
	allocs := testing.AllocsPerRun(100, func() { _, err = p.Alloc(4096) })
	if !errors.Is(err, ErrNoSpace) {
		t.Fatalf("alloc in a full pool: %v, want ErrNoSpace", err)
	}
	if allocs != 0 {
		t.Fatalf("a no-space alloc made %v heap allocations, want 0", allocs)
	}
}

func TestFreeRejectsWhatIsNotLive(t *testing.T) {
	p := newPool(t, 1<<20)
	a, err := p.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Alloc(1000)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		a    Alloc
	}{
		{"wrong length", Alloc{Off: a.Off, Len: a.Len + Alignment}},
		{"shorter length", Alloc{Off: a.Off, Len: Alignment}},
		{"inside a", Alloc{Off: a.Off + Alignment, Len: Alignment}},
		{"free space", Alloc{Off: b.Off + b.Len, Len: Alignment}},
		{"outside pool", Alloc{Off: p.Size() + 4096, Len: Alignment}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := p.Stats()
			if err := p.Free(tt.a); !errors.Is(err, ErrInvalid) {
				t.Fatalf("Free(%+v) err %v, want ErrInvalid", tt.a, err)
			}
			if after := p.Stats(); after != before {
				t.Fatalf("state changed: %+v -> %+v", before, after)
			}
		})
	}
	if err := p.Free(a); err != nil {
		t.Fatal(err)
	}
	before := p.Stats()
	if err := p.Free(a); !errors.Is(err, ErrInvalid) {
		t.Fatalf("double free err %v, want ErrInvalid", err)
	}
	if after := p.Stats(); after != before {
		t.Fatalf("double free changed state: %+v -> %+v", before, after)
	}
	// The freed range is handed out again exactly once.
	c, err := p.Alloc(1000)
	if err != nil || c.Off != a.Off {
		t.Fatalf("realloc = %+v, %v; want off %d (first fit)", c, err, a.Off)
	}
}

func TestSixteenMiBPool(t *testing.T) {
	p := newPool(t, 16<<20)
	// One 8 MiB staging extent plus many block-sized ones, like a small node.
	big, err := p.Alloc(8 << 20)
	if err != nil {
		t.Fatal(err)
	}
	var small []Alloc
	for i := 0; i < 7; i++ {
		a, err := p.Alloc(1 << 20)
		if err != nil {
			t.Fatal(err)
		}
		small = append(small, a)
	}
	s := p.Stats()
	if s.Used != 15<<20 || s.LargestFree != 1<<20 {
		t.Fatalf("stats %+v", s)
	}
	if _, err := p.Alloc(2 << 20); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("err %v", err)
	}
	if err := p.Free(big); err != nil {
		t.Fatal(err)
	}
	for _, a := range small {
		if err := p.Free(a); err != nil {
			t.Fatal(err)
		}
	}
	if s := p.Stats(); s.LargestFree != 16<<20 {
		t.Fatalf("stats %+v", s)
	}
}

func TestSliceAddrWrites(t *testing.T) {
	p := newPool(t, 1<<20)
	a, err := p.Alloc(300)
	if err != nil {
		t.Fatal(err)
	}
	b, err := p.Alloc(5000)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range []Alloc{a, b} {
		s := p.Slice(x)
		if uint64(len(s)) != x.Len || uint64(cap(s)) != x.Len {
			t.Fatalf("Slice(%+v) len %d cap %d", x, len(s), cap(s))
		}
		if got := p.Addr(x); got != p.Base()+x.Off {
			t.Fatalf("Addr %#x, want base+off %#x", got, p.Base()+x.Off)
		}
		if got := uint64(uintptr(unsafe.Pointer(unsafe.SliceData(s)))); got != p.Addr(x) {
			t.Fatalf("slice starts at %#x, Addr says %#x", got, p.Addr(x))
		}
	}
	pa, pb := p.Slice(a), p.Slice(b)
	for i := range pa {
		pa[i] = 0xAA
	}
	for i := range pb {
		pb[i] = byte(i)
	}
	whole := p.Bytes()
	if !bytes.Equal(whole[a.Off:a.Off+a.Len], pa) || whole[b.Off+7] != 7 {
		t.Fatal("writes through Slice not visible in Bytes")
	}
	if pa[len(pa)-1] != 0xAA || pb[0] != 0 {
		t.Fatal("neighbouring allocations overwrote each other")
	}
	if p.Slice(Alloc{Off: p.Size(), Len: 1}) != nil {
		t.Fatal("Slice outside the pool must be nil")
	}
}

func TestClose(t *testing.T) {
	p, err := New(Options{Size: 1 << 20, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	a, err := p.Alloc(64)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if p.Bytes() != nil || p.Slice(a) != nil {
		t.Fatal("memory still reachable after Close")
	}
	if _, err := p.Alloc(64); !errors.Is(err, ErrInvalid) {
		t.Fatalf("Alloc after Close err %v, want ErrInvalid", err)
	}
	// Late frees keep the bookkeeping straight.
	if err := p.Free(a); err != nil {
		t.Fatalf("Free after Close: %v", err)
	}
	if err := p.Free(a); !errors.Is(err, ErrInvalid) {
		t.Fatalf("double Free after Close: %v", err)
	}
}

func TestLockRefusedWarns(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		locked bool
		warn   bool
		fail   bool
	}{
		{"allowed", nil, true, false, false},
		{"EPERM", unix.EPERM, false, true, false},
		{"ENOMEM", unix.ENOMEM, false, true, false},
		{"EINVAL is a bug", unix.EINVAL, false, false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := mlock
			mlock = func([]byte) error { return tt.err }
			t.Cleanup(func() { mlock = old })
			var buf bytes.Buffer
			p, err := New(Options{Size: 1 << 20, Lock: true, Log: zerolog.New(&buf)})
			if tt.fail {
				if err == nil {
					p.Close()
					t.Fatal("New succeeded")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			if p.Locked() != tt.locked || p.Stats().Locked != tt.locked {
				t.Fatalf("Locked %v, want %v", p.Locked(), tt.locked)
			}
			log := buf.String()
			hasWarn := strings.Contains(log, `"level":"warn"`) &&
				strings.Contains(log, "LimitMEMLOCK=infinity") && strings.Contains(log, "ulimit -l unlimited") &&
				strings.Contains(log, "NOT locked")
			if hasWarn != tt.warn {
				t.Fatalf("warning present %v, want %v; log: %s", hasWarn, tt.warn, log)
			}
		})
	}
}

func TestRealMlock(t *testing.T) {
	// Whatever the limit here, New with Lock must not fail on a refusal.
	p, err := New(Options{Size: 16 << 20, Lock: true, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	t.Logf("16 MiB pool locked: %v, numa %d", p.Locked(), p.NUMA())
}

func TestNUMARecorded(t *testing.T) {
	old := numaOfMem
	numaOfMem = func(uint64) int { return 3 }
	t.Cleanup(func() { numaOfMem = old })
	p := newPool(t, 1<<20)
	a, err := p.Alloc(10)
	if err != nil {
		t.Fatal(err)
	}
	if a.NUMA != 3 || p.NUMA() != 3 {
		t.Fatalf("NUMA %d/%d, want 3", a.NUMA, p.NUMA())
	}
	// The real query on a real page answers a node >= 0 (0 where unsupported).
	if n := numaNodeOf(p.Base()); n < 0 {
		t.Fatalf("numaNodeOf = %d", n)
	}
}

func TestFreeAround(t *testing.T) {
	p := newPool(t, 1<<20)
	var as [4]Alloc
	for i := range as {
		var err error
		if as[i], err = p.Alloc(4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Free(as[0]); err != nil {
		t.Fatal(err)
	}
	if err := p.Free(as[2]); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		a             Alloc
		before, after uint64
	}{
		{as[1], 4096, 4096},
		{as[3], 4096, p.Size() - 4*4096},
	}
	for _, tt := range tests {
		b, a := p.FreeAround(tt.a)
		if b != tt.before || a != tt.after {
			t.Errorf("FreeAround(%+v) = %d,%d want %d,%d", tt.a, b, a, tt.before, tt.after)
		}
	}
}

func TestConcurrentAllocFree(t *testing.T) {
	p := newPool(t, 8<<20)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(seed uint64) {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, 9))
			var mine []Alloc
			for i := 0; i < 2000; i++ {
				if len(mine) > 0 && rng.IntN(2) == 0 {
					k := rng.IntN(len(mine))
					if err := p.Free(mine[k]); err != nil {
						t.Error(err)
						return
					}
					mine = append(mine[:k], mine[k+1:]...)
					continue
				}
				a, err := p.Alloc(uint64(rng.IntN(32<<10) + 1))
				if errors.Is(err, ErrNoSpace) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				// Stamp it; a second owner of the same bytes would clobber it.
				s := p.Slice(a)
				s[0], s[len(s)-1] = byte(seed), byte(seed)
				mine = append(mine, a)
			}
			for _, a := range mine {
				s := p.Slice(a)
				if s[0] != byte(seed) || s[len(s)-1] != byte(seed) {
					t.Errorf("allocation %+v clobbered", a)
				}
				if err := p.Free(a); err != nil {
					t.Error(err)
				}
			}
		}(uint64(g))
	}
	wg.Wait()
	if s := p.Stats(); s.Used != 0 || s.LargestFree != p.Size() {
		t.Fatalf("after concurrent run %+v", s)
	}
}

func BenchmarkAllocFree(b *testing.B) {
	for _, frag := range []int{0, 1000} {
		b.Run("fragments="+strconv.Itoa(frag), func(b *testing.B) {
			p := newPool(b, 1<<30)
			// Build a fragmented free list: allocate 2*frag blocks, free every other.
			var keep []Alloc
			for i := 0; i < 2*frag; i++ {
				a, err := p.Alloc(4096)
				if err != nil {
					b.Fatal(err)
				}
				if i%2 == 0 {
					keep = append(keep, a)
				} else {
					defer p.Free(a)
				}
			}
			for _, a := range keep {
				if err := p.Free(a); err != nil {
					b.Fatal(err)
				}
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				a, err := p.Alloc(64 << 10)
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Free(a); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
