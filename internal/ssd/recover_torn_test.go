package ssd

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"testing"

	"github.com/pegaflow/pegad/internal/store"
)

// TestTornHeaderAtFileEndStillOpens: a torn header (magic and version,
// plausible lengths, more than one page long) in the last page of the file
// made scanSegment read past EOF, and Open refused the whole path
// ("recover: EOF"; found in review). It is the end of the segment's
// records.
func TestTornHeaderAtFileEndStillOpens(t *testing.T) {
	e := newEnv(t, 1, MinSize, 1<<20)
	tr, err := Open(e.o)
	if err != nil {
		t.Fatal(err)
	}
	_ = tr.Close()
	path := filepath.Join(e.dirs[0], LogName)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	seg := uint64(1 << 20)
	last := e.o.Size - seg // the ring's last segment (the format page follows it)
	k := store.Key{Namespace: "ns", Hash: "h00001"}
	hl := headerLen(k, 1)
	dl := seg - hl - Align
	rec := make([]byte, hl+dl)
	encodeHeader(rec, 7, 1, k, []store.SlotSize{{KSize: 1, VSize: dl - 1}}, dl)
	if _, err := f.WriteAt(rec, int64(last)); err != nil {
		t.Fatal(err)
	}
	torn := make([]byte, Align)
	le := binary.LittleEndian
	le.PutUint32(torn[0:], magic)
	le.PutUint16(torn[4:], version)
	le.PutUint64(torn[8:], 7)
	le.PutUint32(torn[16:], uint32(alignUp(fixedHdr+2+6+16*1024)))
	le.PutUint16(torn[20:], 2)
	le.PutUint16(torn[22:], 6)
	le.PutUint32(torn[24:], 1024)
	if _, err := f.WriteAt(torn, int64(last+seg-Align)); err != nil {
		t.Fatal(err)
	}
	tr2, err := Open(e.o)
	if err != nil {
		t.Fatalf("Open after a torn last header: %v", err)
	}
	_ = tr2.Close()
}

// TestDecodeHeaderRejectsWrappingSizes: slot sizes whose sum wraps around
// to dataLen passed decodeHeader (found in review).
func TestDecodeHeaderRejectsWrappingSizes(t *testing.T) {
	k := store.Key{Namespace: "ns", Hash: "h1"}
	sz := []store.SlotSize{{KSize: 1 << 63, VSize: 1 << 63}, {KSize: 8, VSize: 8}}
	rec := make([]byte, headerLen(k, 2)+Align)
	encodeHeader(rec, 1, 1, k, sz, 16)
	h, _, err := decodeHeader(rec)
	if err == nil {
		t.Fatalf("decodeHeader accepted sizes %v summing (mod 2^64) to dataLen %d", h.sizes, h.dataLen)
	}
}
