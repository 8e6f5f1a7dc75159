package pool

import (
	"testing"

	"golang.org/x/sys/unix"
)

// TestMemfdSharedMapping: a second mapping of FD (what a local client makes
// after receiving the fd) sees the daemon's writes and the daemon sees its
// writes: the region is one set of shared pages, not a private copy.
func TestMemfdSharedMapping(t *testing.T) {
	p := newPool(t, 1<<20)
	fd := p.FD()
	if fd < 0 {
		t.Fatalf("FD %d on an open pool", fd)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	if uint64(st.Size) != p.Size() {
		t.Fatalf("memfd is %d bytes, pool %d", st.Size, p.Size())
	}
	other, err := unix.Mmap(fd, 0, int(p.Size()), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(other) })

	a, err := p.Alloc(4096)
	if err != nil {
		t.Fatal(err)
	}
	p.Slice(a)[10] = 0x5A
	if got := other[a.Off+10]; got != 0x5A {
		t.Fatalf("client mapping reads %#x, daemon wrote 0x5a", got)
	}
	other[a.Off+11] = 0xA5
	if got := p.Slice(a)[11]; got != 0xA5 {
		t.Fatalf("daemon reads %#x, client wrote 0xa5", got)
	}
}

func TestFDClosed(t *testing.T) {
	p := newPool(t, 1<<20)
	fd := p.FD()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if p.FD() != -1 {
		t.Fatalf("FD after Close %d, want -1", p.FD())
	}
	if err := unix.Fstat(fd, new(unix.Stat_t)); err == nil {
		t.Fatal("memfd still open after Close")
	}
}
