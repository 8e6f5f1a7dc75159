package pool

import (
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// resident counts the pages of b in memory (mincore(2)).
func resident(t *testing.T, b []byte) int {
	t.Helper()
	page := unix.Getpagesize()
	vec := make([]byte, (len(b)+page-1)/page)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&b[0])), uintptr(len(b)),
		uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Fatal(errno)
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n
}

// TestPopulate: every page is faulted in, over several workers, whatever
// the split (uneven, more workers than pages), with and without
// MADV_POPULATE_WRITE.
func TestPopulate(t *testing.T) {
	page := unix.Getpagesize()
	tests := []struct {
		name    string
		pages   int
		workers int
		noAdv   bool
	}{
		{"even", 64, 4, false},
		{"uneven", 67, 4, false},
		{"more workers than pages", 3, 16, false},
		{"one", 1, 1, false},
		{"kernel before 5.14", 67, 4, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.noAdv {
				old := madvise
				madvise = func([]byte, int) error { return unix.EINVAL }
				t.Cleanup(func() { madvise = old })
			}
			mem, err := unix.Mmap(-1, 0, tc.pages*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { unix.Munmap(mem) })
			if r := resident(t, mem); r != 0 {
				t.Fatalf("%d pages resident before populate", r)
			}
			if err := populate(mem, tc.workers); err != nil {
				t.Fatal(err)
			}
			if r := resident(t, mem); r != tc.pages {
				t.Fatalf("%d of %d pages resident after populate", r, tc.pages)
			}
		})
	}
}

// TestPopulateFailure: pages the kernel cannot back (here: a shared file
// mapping past the file's end, which would SIGBUS) fail populate with the
// kernel's error instead of going unnoticed as under MAP_POPULATE.
func TestPopulateFailure(t *testing.T) {
	page := unix.Getpagesize()
	fd, err := unix.MemfdCreate("pegad-populate-test", unix.MFD_CLOEXEC)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	defer unix.Close(fd)
	if err := unix.Ftruncate(fd, int64(page)); err != nil {
		t.Fatal(err)
	}
	mem, err := unix.Mmap(fd, 0, 8*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(mem) })
	if err := populate(mem, 4); !errors.Is(err, unix.EFAULT) {
		t.Fatalf("populate past the file's end: %v, want EFAULT", err)
	}
}

func TestPopulateWorkers(t *testing.T) {
	if n := populateWorkers(1 << 20); n != 1 {
		t.Fatalf("1 MiB: %d workers, want 1", n)
	}
	if n := populateWorkers(1 << 40); n < 1 || n > populateMaxWorkers {
		t.Fatalf("1 TiB: %d workers, want 1..%d", n, populateMaxWorkers)
	}
}
