package ssd

import (
	"bytes"
	"encoding/binary"
	"hash/crc32"
	"os"
	"path/filepath"
	"testing"

	"github.com/pegaflow/pegad/internal/store"
)

// v1Record is a record as format 1 wrote it (fixed part of 48 bytes, no
// seq, no format page), encoded here from the layout, not by the tier.
func v1Record(epoch uint64, k store.Key, data []byte, tomb bool) []byte {
	var sizes []store.SlotSize
	if !tomb {
		sizes = sizes2(uint64(len(data)))
	}
	used := 48 + len(k.Namespace) + len(k.Hash) + 16*len(sizes)
	hl := alignUp(uint64(used))
	rec := make([]byte, hl+alignUp(uint64(len(data))))
	le := binary.LittleEndian
	le.PutUint32(rec[0:], 0x44534750)
	le.PutUint16(rec[4:], 1)
	if tomb {
		le.PutUint16(rec[6:], 1)
	}
	le.PutUint64(rec[8:], epoch)
	le.PutUint32(rec[16:], uint32(hl))
	le.PutUint16(rec[20:], uint16(len(k.Namespace)))
	le.PutUint16(rec[22:], uint16(len(k.Hash)))
	le.PutUint32(rec[24:], uint32(len(sizes)))
	le.PutUint64(rec[32:], uint64(len(data)))
	p := 48 + copy(rec[48:], k.Namespace)
	p += copy(rec[p:], k.Hash)
	for _, s := range sizes {
		le.PutUint64(rec[p:], s.KSize)
		le.PutUint64(rec[p+8:], s.VSize)
		p += 16
	}
	copy(rec[hl:], data)
	tab := crc32.MakeTable(crc32.Castagnoli)
	hc := crc32.Checksum(rec[:used], tab)
	le.PutUint32(rec[28:], hc)
	le.PutUint32(rec[40:], crc32.Update(hc, tab, data))
	return rec
}

// writeV1Log writes a format-1 log of size bytes (the ring alone) at
// dir: segs[i] is segment i's records, in order.
func writeV1Log(t *testing.T, dir string, size, seg uint64, segs map[int][][]byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	img := make([]byte, size)
	for s, recs := range segs {
		off := uint64(s) * seg
		for _, r := range recs {
			off += uint64(copy(img[off:], r))
		}
	}
	if err := os.WriteFile(filepath.Join(dir, LogName), img, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestFormat1LogIsRead: a log written by format 1 (built here) is read as
// format 1 read it (a block's newest copy on its path, a tombstone
// removing its key), then marked as format 2 (a size format 1 refuses to
// read, starting empty rather than misreading), and written on in format
// 2: a format-2 tombstone removes a format-1 block, and a format-2 record
// is newer than every format-1 one, across restarts.
func TestFormat1LogIsRead(t *testing.T) {
	const size, seg, n = 8 << 20, 1 << 20, 16 << 10
	e := newEnv(t, 1, size, seg)
	writeV1Log(t, e.dirs[0], size, seg, map[int][][]byte{
		0: {v1Record(1, key(1), pattern(1, n), false), v1Record(1, key(2), pattern(2, n), false), v1Record(1, key(2), nil, true)},
		1: {v1Record(2, key(3), pattern(3, n), false), v1Record(2, key(1), pattern(11, n), false)},
	})
	tr := e.open(t)
	if st := tr.Stats(); st.Blocks != 2 || tr.Has(key(2)) {
		t.Fatalf("format-1 log read as %d blocks (key 2 held %v), want keys 1 and 3", st.Blocks, tr.Has(key(2)))
	}
	holdsBytes(t, tr, key(1), pattern(11, n), 0) // its newer copy
	mustLoad(t, tr, 3, n)

	path := filepath.Join(e.dirs[0], LogName)
	if fi, err := os.Stat(path); err != nil || fi.Size() != size+Align {
		t.Fatalf("log not marked as format 2: %v, %v bytes (format 1 reads a log of exactly %d)", err, fi.Size(), size)
	}
	spill(t, tr, 4, n)
	if !tr.Forget(key(3)) {
		t.Fatal("Forget of a format-1 block: not held")
	}
	waitIdle(t, tr)
	for range 2 {
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
		tr = e.open(t)
		if tr.Has(key(3)) || tr.Has(key(2)) {
			t.Fatalf("deleted blocks came back: key 3 %v, key 2 %v", tr.Has(key(3)), tr.Has(key(2)))
		}
		holdsBytes(t, tr, key(1), pattern(11, n), 0)
		mustLoad(t, tr, 4, n)
		if entries, _ := tr.Page("", 0, 10, nil); len(entries) != 2 || entries[0].Key != key(4) || entries[1].Key != key(1) {
			t.Fatalf("listing %v: want key 4 (format 2) then key 1", entries)
		}
	}
}

// TestUnknownFormatStartsEmpty: a log whose format page names another
// format (a newer pegad's) or is not one is never read: the log starts
// empty and is marked again.
func TestUnknownFormatStartsEmpty(t *testing.T) {
	for name, edit := range map[string]func(page []byte){
		"newer format": func(p []byte) {
			copy(p[4:8], "LOG3")
			binary.LittleEndian.PutUint32(p[24:], crc32.Checksum(p[:24], castagnoli))
		},
		"torn page": func(p []byte) { p[9] ^= 1 },
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, 1, 8<<20, 1<<20)
			tr := e.open(t)
			spill(t, tr, 1, 16<<10)
			if err := tr.Close(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(e.dirs[0], LogName)
			img, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			edit(img[e.o.Size:])
			if err := os.WriteFile(path, img, 0o600); err != nil {
				t.Fatal(err)
			}
			tr = e.open(t)
			if tr.Has(key(1)) || tr.Stats().Blocks != 0 {
				t.Fatal("a log of another format was read")
			}
			page := make([]byte, Align)
			f, err := os.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.ReadAt(page, int64(e.o.Size)); err != nil {
				t.Fatal(err)
			}
			if why := checkFormatPage(page, e.o.Size, 1<<20); why != "" {
				t.Fatalf("log not marked again: %s", why)
			}
			if !bytes.Equal(page[:4], []byte("PGSD")) {
				t.Fatal("format page does not start with the magic")
			}
		})
	}
}
