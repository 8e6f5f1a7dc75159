package ssd

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"slices"

	"github.com/pegaflow/pegad/internal/store"
)

// segScan is what one segment held at start.
type segScan struct {
	seg     int
	epoch   uint64
	version uint16 // of its records: a segment holds one version
	recs    []loc
	keys    []store.Key
	tombs   []bool // recs[i] is a tombstone of keys[i]
}

// found is a key's newest record at start: a block, or its tombstone.
type found struct {
	l    loc
	tomb bool
}

// recover rebuilds the index from every path's records' headers, reading
// each header (one Align read, more for a block of many slots) and
// skipping the data: data is checked when read back. A segment's records
// end at the first header that is missing, fails its own CRC, has another
// epoch (left from before the segment was reused) or another version.
//
// Which record of a key wins is the tier's write order, over every path:
// the highest seq, a block or its tombstone (version 2). Version 1
// records had no seq; they are read as version 1 read them (legacy), and
// every version 2 record is newer than all of them (format.go). Each
// writer resumes after its path's newest segment; the first write
// reclaims the segment after it, and new records' seqs follow the highest
// found.
func (t *Tier) recover() error {
	scans := make([][]segScan, len(t.devs))
	for i, d := range t.devs {
		sc, err := t.scanDevice(d)
		if err != nil {
			return fmt.Errorf("%w: %s: recover: %w", ErrUnusable, d.path, err)
		}
		scans[i] = sc
	}
	win, v1 := t.legacy(scans)
	tombs := make([]int, len(t.devs))
	newest := map[store.Key]found{}
	maxSeq := v1
	for i := range t.devs {
		for _, sc := range scans[i] {
			for j, l := range sc.recs {
				if sc.version == versionV1 {
					continue
				}
				if sc.tombs[j] {
					tombs[i]++
				}
				maxSeq = max(maxSeq, l.seq)
				if c, ok := newest[sc.keys[j]]; !ok || l.seq > c.l.seq {
					newest[sc.keys[j]] = found{l: l, tomb: sc.tombs[j]}
				}
			}
		}
	}
	for k, c := range newest { // newer than any version 1 record
		if c.tomb {
			delete(win, k)
		} else {
			win[k] = c
		}
	}
	t.indexFound(win, maxSeq, scans, tombs)
	return nil
}

// scanDevice reads d's segments' headers, oldest epoch first, and sets
// where its writer resumes.
func (t *Tier) scanDevice(d *device) ([]segScan, error) {
	var scans []segScan
	buf := alignedBuf(Align)
	for s := 0; s < d.nseg; s++ {
		sc, err := t.scanSegment(d, s, buf)
		if err != nil {
			return nil, err
		}
		if len(sc.recs) > 0 {
			scans = append(scans, sc)
		}
	}
	slices.SortFunc(scans, func(a, b segScan) int { return cmp.Compare(a.epoch, b.epoch) })
	d.cur, d.wpos, d.nextEpoch = d.nseg-1, d.segSize, 1 // the first write takes segment 0
	for _, sc := range scans {
		d.segEpoch[sc.seg] = sc.epoch
		d.cur, d.wpos, d.nextEpoch = sc.seg, d.segSize, sc.epoch+1
	}
	return scans, nil
}

// legacy finds the blocks the version 1 records hold, as version 1 read
// them: per path, segments oldest epoch first, a tombstone removing its
// key's earlier records on its own path; over paths in order, a later
// path's copy replacing an earlier one's. They get seqs 1..n in that
// order, below every version 2 seq: n counts the version 1 records, and
// a log gets version 2 records only once marked, after its last version
// 1 record, so n only falls from there and new seqs start above it.
func (t *Tier) legacy(scans [][]segScan) (win map[store.Key]found, n uint64) {
	win = map[store.Key]found{}
	var seq uint64
	for i := range t.devs {
		live := map[store.Key]loc{} // this path's newest record of each key, less the deleted
		for _, sc := range scans[i] {
			for j, l := range sc.recs {
				switch {
				case sc.version != versionV1:
					continue
				case sc.tombs[j]:
					delete(live, sc.keys[j])
				default:
					live[sc.keys[j]] = l
				}
				n++
			}
		}
		for _, sc := range scans[i] {
			for j, l := range sc.recs {
				if cur, ok := live[sc.keys[j]]; ok && sc.version == versionV1 && !sc.tombs[j] && cur.same(l) {
					seq++
					l.seq = seq
					win[sc.keys[j]] = found{l: l}
				}
			}
		}
	}
	return win, n
}

// indexFound indexes the winners of recover in seq order (listings keep
// it) and resumes the tier's seq after maxSeq.
func (t *Tier) indexFound(win map[store.Key]found, maxSeq uint64, scans [][]segScan, tombs []int) {
	keys := make([]store.Key, 0, len(win))
	for k := range win {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b store.Key) int { return cmp.Compare(win[a].l.seq, win[b].l.seq) })
	t.mu.Lock()
	defer t.mu.Unlock()
	t.seq = max(t.seq, maxSeq)
	blocks := map[*device]int{}
	for _, k := range keys {
		t.indexLocked(k, win[k].l)
		blocks[win[k].l.dev]++
	}
	if t.m != nil {
		t.m.Recovered.Add(float64(len(keys)))
	}
	for i, d := range t.devs {
		t.log.Info().Str("path", d.path).Int("blocks", blocks[d]).Int("tombstones", tombs[i]).Int("segments", len(scans[i])).
			Int("ring", d.nseg).Uint64("segment_size", d.segSize).Bool("direct_io", d.direct).Msg("SSD log opened")
	}
}

// scanSegment reads segment s's headers.
func (t *Tier) scanSegment(d *device, s int, buf []byte) (segScan, error) {
	sc := segScan{seg: s}
	base := uint64(s) * d.segSize
	for pos := uint64(0); pos+Align <= d.segSize; {
		off := int64(base + pos)
		if _, err := d.f.ReadAt(buf[:Align], off); err != nil {
			return sc, err
		}
		h, need, err := decodeHeader(buf[:Align])
		if err == nil && need > 0 {
			// A header longer than a page is checked (CRC) only once read
			// whole; one that would run past the segment is stale bytes
			// or torn: the end of the segment's records, not an error
			// that refuses the path.
			if pos+uint64(need) > d.segSize {
				break
			}
			big := alignedBuf(uint64(need))
			if _, err := d.f.ReadAt(big, off); err != nil {
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
					break
				}
				return sc, err
			}
			h, _, err = decodeHeader(big)
		}
		if errors.Is(err, errNoRecord) {
			break
		}
		if sc.epoch == 0 {
			sc.epoch, sc.version = h.epoch, h.version
		}
		rl := uint64(h.hdrLen) + alignUp(h.dataLen)
		if h.epoch != sc.epoch || h.epoch == 0 || h.version != sc.version || pos+rl > d.segSize {
			break
		}
		sc.recs = append(sc.recs, loc{dev: d, seg: s, epoch: h.epoch, off: off, hdrLen: h.hdrLen, dataLen: h.dataLen, sizes: h.sizes, seq: h.seq})
		sc.keys = append(sc.keys, h.key)
		sc.tombs = append(sc.tombs, h.tomb)
		pos += rl
	}
	return sc, nil
}
