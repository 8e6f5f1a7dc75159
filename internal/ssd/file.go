package ssd

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sync"
	"syscall"
	"unsafe"
)

// openLog opens (creating) the log file at path for direct I/O, falling
// back to buffered I/O where the file system refuses O_DIRECT (tmpfs):
// direct reports which one it got.
func openLog(path string) (f *os.File, direct bool, err error) {
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_DIRECT, 0o600)
	if err == nil {
		return f, true, nil
	}
	if !errors.Is(err, syscall.EINVAL) {
		return nil, false, err
	}
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	return f, false, err
}

// lockLog takes an exclusive lock on f, so that two daemons never share
// one log.
func lockLog(f *os.File) error {
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fmt.Errorf("%s is in use by another process: %w", f.Name(), err)
		}
		return err
	}
	return nil
}

// reserve makes f size bytes with its blocks allocated, so that writes
// into the log never meet a full disk later. A file system without
// fallocate gets a sparse file (reported: preallocated false).
func reserve(f *os.File, size int64) (preallocated bool, err error) {
	err = syscall.Fallocate(int(f.Fd()), 0, 0, size)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
		return false, f.Truncate(size)
	}
	return false, err
}

// alignedBuf returns n bytes (a multiple of Align) starting on an Align
// boundary, as direct I/O wants.
func alignedBuf(n uint64) []byte {
	b := make([]byte, n+Align)
	off := (Align - uint64(uintptr(unsafe.Pointer(&b[0])))%Align) % Align
	return b[off : off+n : off+n]
}

// Record buffers are recycled by size class (powers of two from 64 KiB):
// a spill then copies into memory that is already faulted in rather than
// fresh pages, and a read back lands in one too. Fresh pages measured as
// most of a spill's cost (BenchmarkTierVsFio).
const minClass = 16

var bufPools [48]sync.Pool // by class: *[]byte of 1<<class bytes, aligned

// getBuf returns an aligned buffer of n bytes (n a multiple of Align).
func getBuf(n uint64) []byte {
	c := max(bits.Len64(n-1), minClass)
	if c >= len(bufPools) {
		return alignedBuf(n)
	}
	if v, ok := bufPools[c].Get().(*[]byte); ok {
		return (*v)[:n]
	}
	return alignedBuf(1 << c)[:n]
}

// putBuf recycles a buffer of getBuf; the caller must not use it after.
func putBuf(b []byte) {
	c := bits.Len64(uint64(cap(b)) - 1)
	if cap(b) < 1<<minClass || c >= len(bufPools) || cap(b) != 1<<c {
		return
	}
	b = b[:cap(b)]
	bufPools[c].Put(&b)
}
