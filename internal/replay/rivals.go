package replay

import (
	"container/list"
)

// The fixed rivals of issue 35. Their rules are the issue's, and
// TestRivalsTable holds them to its figures: a change that makes a rival
// weaker (or stronger) fails it.

// WTinyLFUSim is the fixed W-TinyLFU rival of issue 35: a window LRU of
// 1 % of capacity (rounded down, at least 1), then a main LRU of the rest. Exact per-block counts,
// every access counted, are halved every 10 × capacity accesses. A
// window victim enters main only if its count is strictly greater than
// main's LRU victim's; the loser is evicted.
type WTinyLFUSim struct {
	winCap, mainCap int
	win, main       lruList
	count           map[uint64]int
	adds, period    int
}

// NewWTinyLFUSim makes an empty W-TinyLFU of capacity blocks.
func NewWTinyLFUSim(capacity int) *WTinyLFUSim {
	w := max(1, capacity/100)
	if capacity <= 1 {
		w = capacity
	}
	return &WTinyLFUSim{winCap: w, mainCap: capacity - w, win: newLRUList(), main: newLRUList(),
		count: map[uint64]int{}, period: 10 * capacity}
}

func (s *WTinyLFUSim) Has(id uint64) bool { return s.win.has(id) || s.main.has(id) }

func (s *WTinyLFUSim) Access(id uint64) {
	s.count[id]++
	if s.adds++; s.adds >= s.period {
		s.adds = 0
		for k, c := range s.count {
			if c >>= 1; c == 0 {
				delete(s.count, k)
			} else {
				s.count[k] = c
			}
		}
	}
	switch {
	case s.win.has(id):
		s.win.touch(id)
		return
	case s.main.has(id):
		s.main.touch(id)
		return
	case s.winCap <= 0:
		return
	}
	s.win.push(id)
	if s.win.len() <= s.winCap {
		return
	}
	cand := s.win.pop()
	if s.main.len() < s.mainCap {
		s.main.push(cand)
		return
	}
	if s.mainCap > 0 && s.count[cand] > s.count[s.main.oldest()] {
		s.main.pop()
		s.main.push(cand)
	}
}

// S3FIFOSim is the fixed S3-FIFO rival of issue 35 (Yang et al., SOSP
// '23): a small FIFO of 10 % of capacity (rounded down), a main FIFO of
// the rest, and a ghost FIFO, main's size, of the ids evicted from small.
// A hit raises a block's frequency, capped at 3; a miss found in ghost
// enters main, any other miss small. Room is made from small while it
// holds its share: its oldest block moves to main (frequency kept) if it
// was hit there, else it goes to ghost. From main: the oldest block with
// a frequency goes round again with one less, one without is evicted.
// These choices are the ones that reproduce the table (each of
// the others tried, such as a move only at frequency 2, missed a cell).
type S3FIFOSim struct {
	smallCap, mainCap int
	small, main       *list.List // front: newest
	ghost             *list.List
	inSmall, inMain   map[uint64]*list.Element
	inGhost           map[uint64]*list.Element
	freq              map[uint64]int
}

// NewS3FIFOSim makes an empty S3-FIFO of capacity blocks.
func NewS3FIFOSim(capacity int) *S3FIFOSim {
	sc := max(1, capacity/10)
	if capacity <= 1 {
		sc = capacity
	}
	return &S3FIFOSim{smallCap: sc, mainCap: capacity - sc, small: list.New(), main: list.New(), ghost: list.New(),
		inSmall: map[uint64]*list.Element{}, inMain: map[uint64]*list.Element{}, inGhost: map[uint64]*list.Element{},
		freq: map[uint64]int{}}
}

func (s *S3FIFOSim) Has(id uint64) bool {
	_, a := s.inSmall[id]
	_, b := s.inMain[id]
	return a || b
}

func (s *S3FIFOSim) Access(id uint64) {
	if s.Has(id) {
		s.freq[id] = min(s.freq[id]+1, 3)
		return
	}
	if s.smallCap+s.mainCap <= 0 {
		return
	}
	for s.small.Len()+s.main.Len() >= s.smallCap+s.mainCap {
		s.evict()
	}
	s.freq[id] = 0
	if g, ok := s.inGhost[id]; ok {
		s.ghost.Remove(g)
		delete(s.inGhost, id)
		s.inMain[id] = s.main.PushFront(id)
		return
	}
	s.inSmall[id] = s.small.PushFront(id)
}

func (s *S3FIFOSim) evict() {
	if s.small.Len() >= s.smallCap || s.main.Len() == 0 {
		s.evictSmall()
	} else {
		s.evictMain()
	}
}

func (s *S3FIFOSim) evictSmall() {
	for s.small.Len() > 0 {
		e := s.small.Back()
		id := e.Value.(uint64)
		s.small.Remove(e)
		delete(s.inSmall, id)
		if s.freq[id] > 0 {
			s.inMain[id] = s.main.PushFront(id)
			if s.main.Len() > s.mainCap {
				s.evictMain()
			}
			continue
		}
		delete(s.freq, id)
		s.inGhost[id] = s.ghost.PushFront(id)
		if s.ghost.Len() > s.mainCap {
			g := s.ghost.Back()
			s.ghost.Remove(g)
			delete(s.inGhost, g.Value.(uint64))
		}
		return
	}
}

func (s *S3FIFOSim) evictMain() {
	for s.main.Len() > 0 {
		e := s.main.Back()
		id := e.Value.(uint64)
		if f := s.freq[id]; f > 0 {
			s.freq[id] = f - 1
			s.main.MoveToFront(e)
			continue
		}
		s.main.Remove(e)
		delete(s.inMain, id)
		delete(s.freq, id)
		return
	}
}
