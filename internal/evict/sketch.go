package evict

// sketch is a count-min sketch of block accesses with 8-bit counters,
// halved every resetAfter increments so that old popularity fades (as
// TinyLFU's): it remembers blocks after they are evicted, so a block that
// comes back is known for what it was.
type sketch struct {
	rows       [4][]uint8
	mask       uint64
	adds       int
	resetAfter int
}

func newSketch(width int) *sketch {
	w := 1
	for w < width {
		w <<= 1
	}
	s := &sketch{mask: uint64(w - 1), resetAfter: 10 * w}
	for i := range s.rows {
		s.rows[i] = make([]uint8, w)
	}
	return s
}

var seeds = [4]uint64{0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93}

func (s *sketch) slot(i int, id uint64) uint64 {
	h := (id ^ seeds[i]) * 0xFF51AFD7ED558CCD
	h ^= h >> 32
	return h & s.mask
}

// add counts one access of id and returns its estimate after it.
func (s *sketch) add(id uint64) int {
	est := 255
	for i := range s.rows {
		c := &s.rows[i][s.slot(i, id)]
		if *c < 255 {
			*c++
		}
		est = min(est, int(*c))
	}
	if s.adds++; s.adds >= s.resetAfter {
		s.halve()
	}
	return est
}

// grow doubles the sketch's width until it is at least width, keeping
// every estimate: an id's slot in the wider row is its old slot plus
// high bits, so each new counter starts as the old one it splits from.
func (s *sketch) grow(width int) {
	for int(s.mask)+1 < width {
		old := s.mask
		s.mask = old<<1 | 1
		for i := range s.rows {
			row := make([]uint8, s.mask+1)
			for j := range row {
				row[j] = s.rows[i][uint64(j)&old]
			}
			s.rows[i] = row
		}
		s.resetAfter *= 2
	}
}

// estimate is id's count without counting.
func (s *sketch) estimate(id uint64) int {
	est := 255
	for i := range s.rows {
		est = min(est, int(s.rows[i][s.slot(i, id)]))
	}
	return est
}

func (s *sketch) halve() {
	for i := range s.rows {
		for j := range s.rows[i] {
			s.rows[i][j] >>= 1
		}
	}
	s.adds = 0
}
