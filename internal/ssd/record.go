package ssd

// A record is one block on disk: a header, then the block's bytes, each
// padded to Align so that direct I/O can read and write them whole.
//
//	off  size  field
//	  0     4  magic "PGSD" (0x44534750 little endian)
//	  4     2  version (2; 1 is read, never written: see below)
//	  6     2  flags: 1 = tombstone (no slots, no data: the key is deleted)
//	  8     8  epoch: the segment's generation (a record of another epoch
//	           in the same segment is left from before the segment was reused)
//	 16     4  header length (padded, a multiple of Align)
//	 20     2  namespace length
//	 22     2  hash length
//	 24     4  slot count
//	 28     4  header CRC32C (bytes 0..used with both CRC fields zero)
//	 32     8  data length
//	 40     4  record CRC32C (header as above, then the data)
//	 44     4  reserved (0)
//	 48     8  seq: the tier's write order, over every path (version 2)
//	 56        namespace, hash, then per slot K size and V size (8+8)
//
// A tombstone is a header alone (flags 1, slot count 0, data length 0):
// written when a block the log holds is deleted or dropped (Forget, a
// failed checksum or read), so that a restart does not find the block
// again. At start the record or tombstone of a key with the highest seq,
// on any path, decides: a block or its deletion.
//
// Version 1 (before seq) had no seq field: its namespace starts at 48.
// Its records are still read (recover.go: as version 1 read them), and
// every version 2 record is newer than every version 1 record: a log
// gets version 2 records only after it was opened by a pegad that writes
// them, which marks the log first (format.go), so that a pegad that
// reads version 1 alone starts it empty instead of misreading it.
//
// The header CRC lets start-up trust a header (and so find the next
// record) reading headers alone; the record CRC is checked on every read
// back, so torn or corrupted data is never served.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/pegaflow/pegad/api/limits"
	"github.com/pegaflow/pegad/internal/store"
)

// Align is the unit of every on-disk offset and length: a page, which
// direct I/O accepts on every Linux file system that supports it.
const Align = 4096

const (
	magic      = 0x44534750
	version    = 2  // what the writer writes
	versionV1  = 1  // read only: no seq
	fixedHdr   = 56 // version 2's fixed part
	fixedHdrV1 = 48
	offHdrCRC  = 28
	offDataCRC = 40
	offSeq     = 48

	flagTombstone = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors of reading a record back.
var (
	// ErrChecksum: the record failed its CRC32C (torn write, corruption).
	ErrChecksum = errors.New("ssd: record failed its checksum")
	// errNoRecord: no valid header here (end of a segment's records).
	errNoRecord = errors.New("ssd: no record")
)

// header is a record's decoded header.
type header struct {
	version uint16
	epoch   uint64
	seq     uint64 // 0 in version 1
	hdrLen  uint32
	key     store.Key
	sizes   []store.SlotSize
	dataLen uint64
	crc     uint32
	tomb    bool // a tombstone: key deleted, no slots or data
}

func alignUp(n uint64) uint64 { return (n + Align - 1) &^ (Align - 1) }

// headerLen is the padded header length of key with n slots.
func headerLen(key store.Key, n int) uint64 {
	return alignUp(uint64(fixedHdr + len(key.Namespace) + len(key.Hash) + 16*n))
}

// fixedLen is the fixed part of a header of version v; 0: not a version
// this pegad reads.
func fixedLen(v uint16) int {
	switch v {
	case version:
		return fixedHdr
	case versionV1:
		return fixedHdrV1
	}
	return 0
}

// recordLen is the on-disk length of a record.
func recordLen(key store.Key, nslots int, dataLen uint64) uint64 {
	return headerLen(key, nslots) + alignUp(dataLen)
}

// encodeHeader writes the header of key/sizes/data into rec (which holds
// the header then data at rec[headerLen:]) and sets both CRCs; data must
// already be in place. seq is the record's place in the tier's write
// order.
func encodeHeader(rec []byte, epoch, seq uint64, key store.Key, sizes []store.SlotSize, dataLen uint64) {
	encodeRecord(rec, epoch, seq, key, sizes, dataLen, 0)
}

// encodeTombstone writes a tombstone of key into rec (headerLen(key, 0)
// bytes).
func encodeTombstone(rec []byte, epoch, seq uint64, key store.Key) {
	encodeRecord(rec, epoch, seq, key, nil, 0, flagTombstone)
}

func encodeRecord(rec []byte, epoch, seq uint64, key store.Key, sizes []store.SlotSize, dataLen uint64, flags uint16) {
	hl := headerLen(key, len(sizes))
	h := rec[:hl]
	clear(h)
	le := binary.LittleEndian
	le.PutUint32(h[0:], magic)
	le.PutUint16(h[4:], version)
	le.PutUint16(h[6:], flags)
	le.PutUint64(h[8:], epoch)
	le.PutUint32(h[16:], uint32(hl))
	le.PutUint16(h[20:], uint16(len(key.Namespace)))
	le.PutUint16(h[22:], uint16(len(key.Hash)))
	le.PutUint32(h[24:], uint32(len(sizes)))
	le.PutUint64(h[32:], dataLen)
	le.PutUint64(h[offSeq:], seq)
	p := fixedHdr
	p += copy(h[p:], key.Namespace)
	p += copy(h[p:], key.Hash)
	for _, sz := range sizes {
		le.PutUint64(h[p:], sz.KSize)
		le.PutUint64(h[p+8:], sz.VSize)
		p += 16
	}
	used := h[:p]
	hc := crc32.Checksum(used, castagnoli)
	dc := crc32.Update(hc, castagnoli, rec[hl:hl+dataLen])
	le.PutUint32(h[offHdrCRC:], hc)
	le.PutUint32(h[offDataCRC:], dc)
}

// decodeHeader parses and checks the header at the start of b (at least
// Align bytes, or the whole header when it is longer). need > 0: b is
// too short; read need bytes and call again.
//
// It reads both versions (fixedLen); any other is no record.
func decodeHeader(b []byte) (h header, need int, err error) {
	le := binary.LittleEndian
	if len(b) < fixedHdr || le.Uint32(b[0:]) != magic {
		return h, 0, errNoRecord
	}
	h.version = le.Uint16(b[4:])
	fixed := fixedLen(h.version)
	if fixed == 0 {
		return h, 0, errNoRecord
	}
	h.epoch = le.Uint64(b[8:])
	h.hdrLen = le.Uint32(b[16:])
	flags := le.Uint16(b[6:])
	h.tomb = flags == flagTombstone
	nsLen, hashLen, nslots := int(le.Uint16(b[20:])), int(le.Uint16(b[22:])), int(le.Uint32(b[24:]))
	if nsLen < 1 || nsLen > limits.MaxNamespaceLen || hashLen < 1 || hashLen > limits.MaxHashLen ||
		nslots > store.MaxSlots || (flags != 0 && !h.tomb) || (nslots < 1) != h.tomb {
		return h, 0, errNoRecord
	}
	used := fixed + nsLen + hashLen + 16*nslots
	if uint64(h.hdrLen) != alignUp(uint64(used)) {
		return h, 0, errNoRecord
	}
	if len(b) < int(h.hdrLen) { // the whole padded header, as documented
		return h, int(h.hdrLen), nil
	}
	if headerCRC(b[:used], fixed) != le.Uint32(b[offHdrCRC:]) {
		return h, 0, errNoRecord
	}
	h.dataLen = le.Uint64(b[32:])
	h.crc = le.Uint32(b[offDataCRC:])
	if h.version != versionV1 {
		h.seq = le.Uint64(b[offSeq:])
	}
	p := fixed
	h.key.Namespace = string(b[p : p+nsLen])
	p += nsLen
	h.key.Hash = string(b[p : p+hashLen])
	p += hashLen
	if h.tomb {
		if h.dataLen != 0 {
			return h, 0, errNoRecord
		}
		return h, 0, nil
	}
	h.sizes = make([]store.SlotSize, nslots)
	var total uint64
	for i := range h.sizes {
		h.sizes[i] = store.SlotSize{KSize: le.Uint64(b[p:]), VSize: le.Uint64(b[p+8:])}
		// Each size is bounded before the sum, so the sum cannot wrap
		// around to dataLen (a crafted header passing its CRC).
		if h.sizes[i].KSize > store.MaxBlockLen || h.sizes[i].VSize > store.MaxBlockLen {
			return h, 0, errNoRecord
		}
		total += h.sizes[i].KSize + h.sizes[i].VSize
		p += 16
	}
	if total != h.dataLen || h.sizes[0].KSize == 0 || h.dataLen > store.MaxBlockLen {
		return h, 0, errNoRecord
	}
	return h, 0, nil
}

// verify checks the record CRC of rec (header then data, as read from
// disk) against h, and returns the data.
func verify(rec []byte, h header) ([]byte, error) {
	end := uint64(h.hdrLen) + h.dataLen
	if uint64(len(rec)) < end {
		return nil, fmt.Errorf("%w: record of %d bytes, %d read", ErrChecksum, end, len(rec))
	}
	fixed := fixedLen(h.version)
	used := fixed + len(h.key.Namespace) + len(h.key.Hash) + 16*len(h.sizes)
	c := crc32.Update(headerCRC(rec[:used], fixed), castagnoli, rec[h.hdrLen:end])
	if c != h.crc {
		return nil, ErrChecksum
	}
	return rec[h.hdrLen:end], nil
}

// headerCRC is the CRC32C of a header's used bytes hdr (fixed part of
// fixed bytes first) with both CRC fields taken as zero.
func headerCRC(hdr []byte, fixed int) uint32 {
	var tmp [fixedHdr]byte
	copy(tmp[:fixed], hdr)
	clear(tmp[offHdrCRC : offHdrCRC+4])
	clear(tmp[offDataCRC : offDataCRC+4])
	return crc32.Update(crc32.Checksum(tmp[:fixed], castagnoli), castagnoli, hdr[fixed:])
}
