package pool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/rs/zerolog"
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

// Where the kernel reports hugetlb reservations, globally and per NUMA
// node, and the THP policy of shmem (a memfd is shmem); tests replace them.
var (
	hugeSysfs    = "/sys/kernel/mm/hugepages"
	nodeSysfs    = "/sys/devices/system/node"
	thpShmemPath = "/sys/kernel/mm/transparent_hugepage/shmem_enabled"
)

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
	free, err := readFreePages(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: %s pages not supported here: %v", ErrHugePages, mode, err)
		}
		return fmt.Errorf("%w: %s pages: %v", ErrHugePages, mode, err)
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

// readFreePages reads free_hugepages in dir.
func readFreePages(dir string) (uint64, error) {
	b, err := os.ReadFile(filepath.Join(dir, "free_hugepages"))
	if err != nil {
		return 0, err
	}
	free, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%w: %s: %v", ErrHugePages, dir, err)
	}
	return free, nil
}

// checkNodeHugePages says whether each part bound to a NUMA node finds
// enough free 2M/1G pages reserved on that node: a part is bound to its
// node, so pages reserved on another node do not back it, though the
// global count (checkHugePages) includes them. A node the kernel does not
// report (no NUMA sysfs) is not checked.
func checkNodeHugePages(mode string, parts []part) error {
	if mode != HugePages2M && mode != HugePages1G {
		return nil
	}
	ps := hugePageSize(mode)
	for _, pt := range parts {
		if pt.node < 0 {
			continue
		}
		dir := filepath.Join(nodeSysfs, fmt.Sprintf("node%d", pt.node), "hugepages", fmt.Sprintf("hugepages-%dkB", ps>>10))
		free, err := readFreePages(dir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("%w: %s pages on NUMA node %d: %v", ErrHugePages, mode, pt.node, err)
		}
		if need := (pt.len + ps - 1) / ps; free < need {
			return fmt.Errorf("%w: the pool's part on NUMA node %d needs %d free %s pages, that node has %d "+
				"(reserve them there: echo %d > %s/nr_hugepages)", ErrHugePages, pt.node, need, mode, free, need, dir)
		}
	}
	return nil
}

// thpShmem is the kernel's THP policy for shmem (the bracketed entry of
// shmem_enabled: always, within_size, advise, never, deny, force).
func thpShmem() (string, error) {
	b, err := os.ReadFile(thpShmemPath)
	if err != nil {
		return "", err
	}
	for _, f := range strings.Fields(string(b)) {
		if len(f) > 2 && f[0] == '[' && f[len(f)-1] == ']' {
			return f[1 : len(f)-1], nil
		}
	}
	return "", fmt.Errorf("%s: no selected policy in %q", thpShmemPath, strings.TrimSpace(string(b)))
}

// logTHPShmem says whether --pool-hugepages thp can work: the pool is a
// memfd, which is shmem, and madvise(MADV_HUGEPAGE) gives shmem huge pages
// only when shmem_enabled is always, within_size, advise or force (not
// the anonymous-memory setting, transparent_hugepage/enabled).
func logTHPShmem(log zerolog.Logger) {
	mode, err := thpShmem()
	switch {
	case err != nil:
		log.Warn().Err(err).Msg("pool asks for transparent huge pages, but the shmem THP policy is unknown: it may get 4 KiB pages")
	case mode == "never" || mode == "deny":
		log.Warn().Str("shmem_enabled", mode).Str("path", thpShmemPath).
			Msg("pool asks for transparent huge pages, but shmem THP is off: the pool (a memfd) gets 4 KiB pages; " +
				"echo advise > " + thpShmemPath + ", or use --pool-hugepages 2M")
	default:
		log.Info().Str("shmem_enabled", mode).Msg("pool asks for transparent huge pages (shmem THP allows them)")
	}
}
