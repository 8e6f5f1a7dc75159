package ssd

import (
	"errors"
	"fmt"
	"os"
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
