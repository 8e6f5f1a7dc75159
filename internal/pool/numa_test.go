package pool

import (
	"errors"
	"slices"
	"testing"
	"unsafe"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"
)

// recordPolicy records Bind calls and answers NodeOf from them (or from
// override when set: where the kernel put a page despite the binding).
type recordPolicy struct {
	binds    []part // off is the address here
	override map[int]int
}

func (r *recordPolicy) Bind(mem []byte, node int) error {
	r.binds = append(r.binds, part{uint64(uintptr(unsafe.Pointer(&mem[0]))), uint64(len(mem)), node})
	return nil
}

func (r *recordPolicy) NodeOf(addr uint64) int {
	for _, b := range r.binds {
		if addr >= b.off && addr-b.off < b.len {
			if n, ok := r.override[b.node]; ok {
				return n
			}
			return b.node
		}
	}
	return 0
}

func newSplitPool(t *testing.T, size uint64, nodes []int, pol MemPolicy) *Pool {
	t.Helper()
	p, err := New(Options{Size: size, Log: zerolog.Nop(), Nodes: nodes, Policy: pol})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// TestSplitOverNodes: a pool over two nodes is two parts, each bound to its
// node before populating; AllocOn places on the node asked for and falls
// back to the other when full; no allocation or free range straddles the
// boundary; NodeOf answers per address.
func TestSplitOverNodes(t *testing.T) {
	const size = 8 << 20
	pol := &recordPolicy{}
	p := newSplitPool(t, size, []int{1, 0, 1, -1}, pol)
	if got := p.Nodes(); !slices.Equal(got, []int{1, 0}) {
		t.Fatalf("Nodes() = %v, want [1 0] (distinct, in order)", got)
	}
	want := []part{{p.Base(), size / 2, 1}, {p.Base() + size/2, size / 2, 0}}
	if !slices.Equal(pol.binds, want) {
		t.Fatalf("binds %+v, want %+v", pol.binds, want)
	}
	if n := p.NodeOf(p.Base() + size/2 - 1); n != 1 {
		t.Fatalf("NodeOf(last byte of part 0) = %d, want 1", n)
	}
	if n := p.NodeOf(p.Base() + size/2); n != 0 {
		t.Fatalf("NodeOf(first byte of part 1) = %d, want 0", n)
	}
	if n := p.NodeOf(p.Base() + size); n != -1 {
		t.Fatalf("NodeOf(past the end) = %d, want -1", n)
	}

	a, err := p.AllocOn(0, 1<<20)
	if err != nil || a.NUMA != 0 || a.Off != size/2 {
		t.Fatalf("AllocOn(0) = %+v, %v; want the start of node 0's part", a, err)
	}
	// Fill node 0's part; the next AllocOn(0) falls back to node 1.
	rest, err := p.AllocOn(0, size/2-1<<20)
	if err != nil || rest.NUMA != 0 {
		t.Fatalf("AllocOn(0, rest) = %+v, %v", rest, err)
	}
	fb, err := p.AllocOn(0, 4096)
	if err != nil || fb.NUMA != 1 || p.NodeOf(p.Addr(fb)) != 1 {
		t.Fatalf("AllocOn(0) with node 0 full = %+v, %v; want node 1", fb, err)
	}
	for _, x := range []Alloc{a, rest, fb} {
		if err := p.Free(x); err != nil {
			t.Fatal(err)
		}
	}
	// Free ranges do not merge across the boundary: nothing larger than
	// a part fits, and the largest free range is one part.
	if st := p.Stats(); st.LargestFree != size/2 || st.Used != 0 {
		t.Fatalf("stats after freeing all %+v, want largest free %d", st, size/2)
	}
	if _, err := p.Alloc(size/2 + 4096); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("alloc larger than a part: %v, want ErrNoSpace", err)
	}
	half, err := p.Alloc(size / 2)
	if err != nil || half.NUMA != 1 {
		t.Fatalf("alloc of a whole part: %+v %v", half, err)
	}
	if b, a := p.FreeAround(half); b != 0 || a != 0 {
		t.Fatalf("FreeAround(part 0) = %d,%d, want 0,0 (part 1's free range is another node's)", b, a)
	}
}

// TestSplitRecordsWhereItIs: a part whose binding did not hold (the
// kernel put it elsewhere) records the node its pages are really on.
func TestSplitRecordsWhereItIs(t *testing.T) {
	p := newSplitPool(t, 4<<20, []int{0, 1}, &recordPolicy{override: map[int]int{1: 0}})
	if got := p.Nodes(); !slices.Equal(got, []int{0, 0}) {
		t.Fatalf("Nodes() = %v, want [0 0]", got)
	}
	a, err := p.AllocOn(1, 4096)
	if err != nil || a.NUMA != 0 {
		t.Fatalf("AllocOn(1) = %+v, %v; want NUMA 0 (where the pages are)", a, err)
	}
}

// TestSplitMemfdShared: the split pool is still one memfd a local client
// maps whole: its mapping sees the daemon's writes in every part.
func TestSplitMemfdShared(t *testing.T) {
	p := newSplitPool(t, 4<<20, []int{0, 1}, &recordPolicy{})
	other, err := unix.Mmap(p.FD(), 0, int(p.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(other) })
	for _, node := range []int{0, 1} {
		a, err := p.AllocOn(node, 64)
		if err != nil {
			t.Fatal(err)
		}
		p.Slice(a)[7] = byte(0x40 + node)
		if other[a.Off+7] != byte(0x40+node) {
			t.Fatalf("client mapping misses the write in node %d's part", node)
		}
	}
}

// skipWithoutMbind skips where this host refuses mbind(2): a kernel
// without CONFIG_NUMA (ENOSYS) or a container whose seccomp profile
// allows it only with CAP_SYS_NICE (EPERM). The pool then warns and runs
// unbound, which TestSplitOverNodes covers with a fake policy.
func skipWithoutMbind(t *testing.T) {
	t.Helper()
	page := unix.Getpagesize()
	mem, err := unix.Mmap(-1, 0, page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if err := (kernelPolicy{}).Bind(mem, 0); err != nil {
		t.Skipf("this host refuses mbind: %v", err)
	}
}

// TestRealMbindNode0: on this host, a pool bound to node 0 really carries
// MPOL_BIND with node 0 in its nodemask (get_mempolicy on its pages), in
// both parts' worth of memory, and its pages are on node 0.
func TestRealMbindNode0(t *testing.T) {
	skipWithoutMbind(t)
	p := newSplitPool(t, 4<<20, []int{0}, nil)
	for _, off := range []uint64{0, p.Size() - 1} {
		var mode int32
		var mask [16]uint64
		_, _, errno := unix.Syscall6(unix.SYS_GET_MEMPOLICY, uintptr(unsafe.Pointer(&mode)),
			uintptr(unsafe.Pointer(&mask[0])), uintptr(len(mask)*64), uintptr(p.Base()+off), mpolFAddr, 0)
		if errno != 0 {
			t.Skipf("get_mempolicy: %v (no NUMA support here)", errno)
		}
		if mode != mpolBind || mask[0] != 1 {
			t.Fatalf("policy at +%d: mode %d mask %#x, want MPOL_BIND (%d) on node 0", off, mode, mask[0], mpolBind)
		}
	}
	if p.NUMA() != 0 || p.Nodes()[0] != 0 {
		t.Fatalf("pool on node %v", p.Nodes())
	}
}

// TestSplitPartsSmallPool (review finding): a pool with less than one
// split unit per node (--pool-hugepages thp with a 1 MiB pool over two
// nodes) divided by zero. It gets as many parts as it has units, at least
// one, on the first nodes given, and the parts always cover the pool.
func TestSplitPartsSmallPool(t *testing.T) {
	const mib = 1 << 20
	cases := []struct {
		name       string
		size, page uint64
		nodes      []int
		want       []part
	}{
		{"less than a unit, two nodes", 1 * mib, 2 * mib, []int{0, 1}, []part{{0, 1 * mib, 0}}},
		{"less than a unit, one node", 1 * mib, 2 * mib, []int{1}, []part{{0, 1 * mib, 1}}},
		{"one unit, two nodes", 2 * mib, 2 * mib, []int{1, 0}, []part{{0, 2 * mib, 1}}},
		{"two units, three nodes", 5 * mib, 2 * mib, []int{0, 1, 2}, []part{{0, 2 * mib, 0}, {2 * mib, 3 * mib, 1}}},
		{"a unit per node", 4 * mib, 2 * mib, []int{0, 1}, []part{{0, 2 * mib, 0}, {2 * mib, 2 * mib, 1}}},
		{"no nodes", 1 * mib, 2 * mib, nil, []part{{0, 1 * mib, -1}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := splitParts(tc.size, tc.page, tc.nodes)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("splitParts(%d, %d, %v) = %v, want %v", tc.size, tc.page, tc.nodes, got, tc.want)
			}
		})
	}
}

// TestAllocSpreadsOverParts (issue 27 item 3): blocks allocated with no
// node in mind spread over a split pool's parts, instead of filling part 0
// first (then about half of a fetch's source bytes cross the socket link
// whatever NIC reads them). Frees keep the per-part counters exact.
func TestAllocSpreadsOverParts(t *testing.T) {
	const size = 8 << 20
	p := newSplitPool(t, size, []int{0, 1}, &recordPolicy{})
	var as []Alloc
	for i := 0; i < 16; i++ { // 16 × 256 KiB: half the pool
		a, err := p.Alloc(256 << 10)
		if err != nil {
			t.Fatal(err)
		}
		as = append(as, a)
	}
	parts := p.PartStats()
	if len(parts) != 2 || parts[0].Node != 0 || parts[1].Node != 1 || parts[0].Size != size/2 {
		t.Fatalf("parts %+v", parts)
	}
	if parts[0].Used != 2<<20 || parts[1].Used != 2<<20 {
		t.Fatalf("after 16 allocs of 256 KiB: part use %d / %d bytes, want 2 MiB each", parts[0].Used, parts[1].Used)
	}
	for _, a := range as[:8] {
		if err := p.Free(a); err != nil {
			t.Fatal(err)
		}
	}
	var used [2]uint64
	for _, a := range as[8:] {
		used[p.partOf(a.Off)] += a.Len
	}
	if parts := p.PartStats(); parts[0].Used != used[0] || parts[1].Used != used[1] {
		t.Fatalf("after frees: counters %+v, live allocations %v", parts, used)
	}
}
