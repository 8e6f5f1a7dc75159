package testutil

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
)

// ssdPage is the SSD tier's page, ssd.Align (not imported: the store's
// tests import testutil, and ssd imports store).
const ssdPage = 4096

// CorruptSSDLog flips the first byte of every written page (ssdPage) of
// the SSD tier's log at path that is not a record header, syncs the file,
// and returns how many pages it flipped: every block's data then fails its
// checksum, while the headers still parse.
func CorruptSSDLog(path string) (int, error) {
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	page := make([]byte, ssdPage)
	flipped := 0
	for off := int64(0); ; off += ssdPage {
		if _, err := f.ReadAt(page, off); err != nil {
			break
		}
		if string(page[:4]) == "PGSD" || bytes.Count(page, []byte{0}) == len(page) {
			continue // a header (magic 0x44534750 little endian: "PGSD"), or never written
		}
		page[0] ^= 0xff
		if _, err := f.WriteAt(page[:1], off); err != nil {
			return flipped, fmt.Errorf("corrupt page at %d: %w", off, err)
		}
		flipped++
	}
	return flipped, f.Sync()
}

// FillDisk writes path until its file system is full: nil once a write
// fails with ENOSPC, else the error that stopped it.
func FillDisk(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				return nil
			}
			return err
		}
	}
}

// SSDDrops sums a scrape's pegaflow_ssd_drops_total series (every reason).
func SSDDrops(m map[string]float64) float64 {
	var d float64
	for k, v := range m {
		if strings.HasPrefix(k, "pegaflow_ssd_drops_total{") {
			d += v
		}
	}
	return d
}

// SSDDrained reports whether a scrape shows the SSD tier's write queue
// empty and every block evicted so far written or dropped.
func SSDDrained(m map[string]float64) bool {
	return m["pegaflow_ssd_write_queue_depth"] == 0 &&
		m["pegaflow_ssd_writes_total"]+SSDDrops(m) >= m["pegaflow_block_evictions_total"]
}
