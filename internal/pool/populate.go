package pool

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Populating a pool is the kernel zeroing every page on first touch, which
// one core does at a fraction of the memory bandwidth: MAP_POPULATE alone
// takes minutes for a TiB. populate splits the pool over several workers.

const (
	populateMaxWorkers = 16
	populateMinChunk   = 64 << 20 // below this a worker costs more than it saves
)

// populateWorkers is how many goroutines populate size bytes.
func populateWorkers(size uint64) int {
	return max(1, min(runtime.NumCPU(), populateMaxWorkers, int(size/populateMinChunk)))
}

// madvise is unix.Madvise, swappable in tests.
var madvise = unix.Madvise

// populate faults in every page of mem, split over workers, each with
// MADV_POPULATE_WRITE (Linux 5.14) on its range, or one write per page
// where the kernel does not know that advice. It returns the first failure
// (ENOMEM, EFAULT: the kernel could not back the pool, a cgroup limit),
// which MAP_POPULATE swallows and a page fault under load later turns into
// SIGBUS or the OOM killer.
func populate(mem []byte, workers int) error {
	if len(mem) == 0 {
		return nil
	}
	page := unix.Getpagesize()
	pages := (len(mem) + page - 1) / page
	workers = max(1, min(workers, pages))
	per := (pages + workers - 1) / workers * page
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo := min(w*per, len(mem))
		hi := min(lo+per, len(mem))
		if lo == hi {
			continue
		}
		wg.Go(func() { errs[w] = populateRange(mem[lo:hi], page) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

func populateRange(b []byte, page int) error {
	err := madvise(b, unix.MADV_POPULATE_WRITE)
	if err == nil {
		return nil
	}
	if !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("populate [%#x,+%d): %w", uintptr(unsafe.Pointer(&b[0])), len(b), err)
	}
	// EINVAL: a kernel before 5.14 (the pool is read-write, so not the
	// permission case). A write fault per page populates it.
	for i := 0; i < len(b); i += page {
		b[i] = 0
	}
	return nil
}
