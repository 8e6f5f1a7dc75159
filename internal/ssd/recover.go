package ssd

import (
	"errors"
	"io"
	"sort"

	"github.com/pegaflow/pegad/internal/store"
)

// segScan is what one segment held at start.
type segScan struct {
	seg   int
	epoch uint64
	recs  []loc
	keys  []store.Key
	tombs []bool // recs[i] is a tombstone of keys[i]
}

// recover rebuilds d's part of the index from its records' headers,
// reading each header (one Align read, more for a block of many slots)
// and skipping the data: data is checked when read back. A segment's
// records end at the first header that is missing, fails its own CRC, or
// has another epoch (left from before the segment was reused). Segments
// are applied oldest epoch first, so a block written twice ends at its
// newest copy, and a tombstone removes the records of its key before it.
// A tombstone speaks only for its own path (it follows the record it
// deletes on the same log, and epochs order one log only), so each path's
// survivors are found first and then indexed. The writer resumes after
// the newest segment; the first write reclaims the segment after it.
func (t *Tier) recover(d *device) error {
	var scans []segScan
	buf := alignedBuf(Align)
	for s := 0; s < d.nseg; s++ {
		sc, err := t.scanSegment(d, s, buf)
		if err != nil {
			return err
		}
		if len(sc.recs) > 0 {
			scans = append(scans, sc)
		}
	}
	sort.Slice(scans, func(i, j int) bool { return scans[i].epoch < scans[j].epoch })
	d.cur, d.wpos, d.nextEpoch = d.nseg-1, d.segSize, 1 // the first write takes segment 0
	live := map[store.Key]loc{}                         // this path's newest record of each key, less the deleted
	tombs := 0
	for _, sc := range scans {
		d.segEpoch[sc.seg] = sc.epoch
		for i, l := range sc.recs {
			if sc.tombs[i] {
				delete(live, sc.keys[i])
				tombs++
			} else {
				live[sc.keys[i]] = l
			}
		}
		d.cur, d.wpos, d.nextEpoch = sc.seg, d.segSize, sc.epoch+1
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, sc := range scans { // in write order, so listings keep it
		for i, l := range sc.recs {
			if cur, ok := live[sc.keys[i]]; ok && !sc.tombs[i] && cur.same(l) {
				t.indexLocked(sc.keys[i], l)
				n++
			}
		}
	}
	if t.m != nil {
		t.m.Recovered.Add(float64(n))
	}
	t.log.Info().Str("path", d.path).Int("blocks", n).Int("tombstones", tombs).Int("segments", len(scans)).Int("ring", d.nseg).
		Uint64("segment_size", d.segSize).Bool("direct_io", d.direct).Msg("SSD log opened")
	return nil
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
			sc.epoch = h.epoch
		}
		rl := uint64(h.hdrLen) + alignUp(h.dataLen)
		if h.epoch != sc.epoch || h.epoch == 0 || pos+rl > d.segSize {
			break
		}
		sc.recs = append(sc.recs, loc{dev: d, seg: s, epoch: h.epoch, off: off, hdrLen: h.hdrLen, dataLen: h.dataLen, sizes: h.sizes})
		sc.keys = append(sc.keys, h.key)
		sc.tombs = append(sc.tombs, h.tomb)
		pos += rl
	}
	return sc, nil
}
