package pool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Huge pages for the pool (Options.HugePages): fewer TLB misses on the
// host side and, for the NIC, fewer and larger entries to translate and
// pin. "thp" asks the kernel to back the pool with transparent huge pages
// (madvise); "2M" and "1G" map it from the hugetlbfs pool the operator
// reserved (vm.nr_hugepages), which must hold the whole pool.
const (
	HugePagesNone = "none"
	HugePagesTHP  = "thp"
	HugePages2M   = "2M"
	HugePages1G   = "1G"
)

// ErrHugePages: the huge pages asked for are not reserved (or unknown).
var ErrHugePages = errors.New("pool: huge pages unavailable")

// hugeSysfs is where the kernel reports hugetlb reservations (tests
// replace it).
var hugeSysfs = "/sys/kernel/mm/hugepages"

// hugePageSize is the page size of mode's mapping: the pool's size is
// rounded up to it (a hugetlb mapping is whole pages).
func hugePageSize(mode string) uint64 {
	switch mode {
	case HugePages2M:
		return 2 << 20
	case HugePages1G:
		return 1 << 30
	}
	return uint64(unix.Getpagesize())
}

// hugeMemfdFlags are the extra memfd_create(2) flags of mode: the pool's
// memfd then lives on the hugetlbfs pool of that page size.
func hugeMemfdFlags(mode string) int {
	switch mode {
	case HugePages2M:
		return unix.MFD_HUGETLB | unix.MFD_HUGE_2MB
	case HugePages1G:
		return unix.MFD_HUGETLB | unix.MFD_HUGE_1GB
	}
	return 0
}

// checkHugePages says, before anything is mapped, whether mode can back
// size bytes: a known mode, and for 2M/1G enough free reserved pages,
// with an error naming the sysctl to raise.
func checkHugePages(mode string, size uint64) error {
	switch mode {
	case "", HugePagesNone, HugePagesTHP:
		return nil
	case HugePages2M, HugePages1G:
	default:
		return fmt.Errorf("%w: mode %q is not none, thp, 2M or 1G", ErrHugePages, mode)
	}
	ps := hugePageSize(mode)
	dir := filepath.Join(hugeSysfs, fmt.Sprintf("hugepages-%dkB", ps>>10))
	b, err := os.ReadFile(filepath.Join(dir, "free_hugepages"))
	if err != nil {
		return fmt.Errorf("%w: %s pages not supported here: %v", ErrHugePages, mode, err)
	}
	free, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrHugePages, dir, err)
	}
	need := (size + ps - 1) / ps
	if free < need {
		return fmt.Errorf("%w: the pool needs %d free %s pages, %d are (reserve them: echo %d > %s/nr_hugepages, "+
			"or vm.nr_hugepages / hugepagesz=%s hugepages=%d on the kernel command line)",
			ErrHugePages, need, mode, free, need, dir, mode, need)
	}
	return nil
}

// adviseHuge asks for transparent huge pages on mem when mode is thp (a
// hint: a kernel with THP off leaves 4 KiB pages).
func adviseHuge(mem []byte, mode string) {
	if mode == HugePagesTHP {
		_ = madvise(mem, unix.MADV_HUGEPAGE)
	}
}
