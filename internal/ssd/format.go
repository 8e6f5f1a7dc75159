package ssd

// A log's last page, after its ring (file offset Size), names the log's
// format, so that no pegad misreads a log that another wrote:
//
//	off  size  field
//	  0     4  magic "PGSD" (as a record's)
//	  4     4  "LOG2": the log holds version 2 records (record.go)
//	  8     8  ring size (Size)
//	 16     8  segment size
//	 24     4  CRC32C of bytes 0..24
//
// A format-1 log has no such page: its file is Size bytes, the ring alone.
// Opening one reads its records as version 1 and marks it (the page, and
// so the file's size, Size+Align) before the first version 2 record is
// written. A pegad that writes only version 1 finds the marked log's size
// unlike --ssd-size and starts it empty: it never reads version 2 records
// as its own, and never appends version 1 records after them.

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
)

const (
	formatTag  = "LOG2"
	formatUsed = 28
)

// logFormat is what openDevice found in a log file.
type logFormat int

const (
	formatEmpty  logFormat = iota // a new file, or one started empty
	formatV1                      // the ring alone: version 1 records
	formatMarked                  // the ring and its format page
)

// encodeFormatPage fills page (Align bytes) with the format page of a
// ring of size bytes in segments of segSize.
func encodeFormatPage(page []byte, size, segSize uint64) {
	clear(page)
	le := binary.LittleEndian
	le.PutUint32(page[0:], magic)
	copy(page[4:8], formatTag)
	le.PutUint64(page[8:], size)
	le.PutUint64(page[16:], segSize)
	le.PutUint32(page[24:], crc32.Checksum(page[:24], castagnoli))
}

// checkFormatPage reports why page is not the format page of a ring of
// size bytes in segments of segSize ("" when it is).
func checkFormatPage(page []byte, size, segSize uint64) string {
	le := binary.LittleEndian
	switch {
	case le.Uint32(page[0:]) != magic || le.Uint32(page[24:]) != crc32.Checksum(page[:24], castagnoli):
		return "no valid format page"
	case string(page[4:8]) != formatTag:
		return fmt.Sprintf("format %q, this pegad reads %q", page[4:8], formatTag)
	case le.Uint64(page[8:]) != size || le.Uint64(page[16:]) != segSize:
		return fmt.Sprintf("another geometry (size %d, segments of %d)", le.Uint64(page[8:]), le.Uint64(page[16:]))
	}
	return ""
}

// readFormat tells the format of f, a log of cur bytes, for a ring of
// size bytes in segments of segSize; why says what is wrong with a log to
// start empty.
func readFormat(f *os.File, cur, size, segSize uint64) (lf logFormat, why string, err error) {
	switch cur {
	case 0:
		return formatEmpty, "", nil
	case size:
		return formatV1, "", nil
	case size + Align:
		page := alignedBuf(Align)
		if _, err := f.ReadAt(page, int64(size)); err != nil {
			return 0, "", fmt.Errorf("read the format page: %w", err)
		}
		if why := checkFormatPage(page, size, segSize); why != "" {
			return formatEmpty, why, nil
		}
		return formatMarked, "", nil
	}
	return formatEmpty, fmt.Sprintf("another size (%d bytes, want %d)", cur, size+Align), nil
}

// markFormat writes f's format page and syncs it, before any version 2
// record is written.
func markFormat(f *os.File, size, segSize uint64) error {
	page := alignedBuf(Align)
	encodeFormatPage(page, size, segSize)
	if _, err := f.WriteAt(page, int64(size)); err != nil {
		return fmt.Errorf("write the format page: %w", err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("sync the format page: %w", err)
	}
	return nil
}
