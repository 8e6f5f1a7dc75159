package store

import (
	"sync"
	"time"

	"github.com/pegaflow/pegad/internal/metrics"
)

// Pins: a pinned block's memory stays until its last Unpin, even once it
// has left the index (Delete, eviction never takes a pinned block).

// Pin looks up keys and pins the found ones (in order); missing lists the
// indexes of keys not found. A pinned block's memory stays until Unpin.
// Pinning counts as an access for the LRU.
//
// It works in two passes so that concurrent queries do not queue on mu
// while keys are hashed: the lookups run under idxMu read-locked, then mu
// is held only to pin the blocks found, with no allocation and no hashing
// (what the policy and the hints are told is made ready before it). A
// block removed between the passes (its elem is nil under mu) is reported
// missing, as if the lookup had come after the removal; a block found in
// the second pass is indexed, so its memory cannot be freed.
func (s *Store) Pin(keys []Key) (pinned []*Block, missing []int) {
	return s.pin(chain{keys: keys})
}

// PinChain is Pin of the keys {ns, hashes[i]}, without a Key per hash: a
// string is made only of the hashes the store keeps (a missing one's
// parent hint, a promotion), so hashes may be reused once it returns.
func (s *Store) PinChain(ns string, hashes [][]byte) (pinned []*Block, missing []int) {
	return s.pin(chain{ns: ns, hashes: hashes})
}

// chain is what a pin looks up: keys, or (keys nil) one namespace's hashes.
type chain struct {
	keys   []Key
	ns     string
	hashes [][]byte
}

func (c chain) len() int {
	if c.keys != nil {
		return len(c.keys)
	}
	return len(c.hashes)
}

// key is key i, as a Key the store may keep (it allocates for hashes).
func (c chain) key(i int) Key {
	if c.keys != nil {
		return c.keys[i]
	}
	return Key{Namespace: c.ns, Hash: string(c.hashes[i])}
}

// id is key i's keyID, without a Key.
func (c chain) id(i int) uint64 {
	if c.keys != nil {
		return keyID(c.keys[i])
	}
	return hashID(c.ns, c.hashes[i])
}

// lookup fills found with the chain's indexed blocks, finding each
// namespace's map once per run of keys in it; idxMu held.
func (c chain) lookup(x *blockIndex, found []*Block) (n int) {
	if c.keys == nil {
		m := x.namespace(c.ns)
		for i, h := range c.hashes {
			if b := m[string(h)]; b != nil { // no string is made for the lookup
				found[i] = b
				n++
			}
		}
		return n
	}
	var m map[string]*Block
	for i, k := range c.keys {
		if i == 0 || k.Namespace != c.keys[i-1].Namespace {
			m = x.namespace(k.Namespace)
		}
		if b := m[k.Hash]; b != nil {
			found[i] = b
			n++
		}
	}
	return n
}

func (s *Store) pin(c chain) (pinned []*Block, missing []int) {
	sc := pinScratches.Get().(*pinScratch)
	defer sc.put()
	found, n := s.pinFound(c, sc)
	if s.lower != nil {
		s.countHit(metrics.TierDRAM, n)
		// Keys only on the lower tier are read back and pinned; a key
		// the pool cannot take now (pinned full) stays missing.
		for i, b := range found {
			if b != nil {
				continue
			}
			k := c.key(i)
			if !s.promote(k) {
				continue
			}
			if p, m := s.pinFound(chain{keys: []Key{k}}, nil); m == 1 {
				found[i] = p[0]
				n++
				s.countHit(metrics.TierSSD, 1)
			}
		}
	}
	if n > 0 {
		pinned = make([]*Block, 0, n)
	}
	for i, b := range found {
		if b == nil {
			missing = append(missing, i)
		} else {
			pinned = append(pinned, b)
		}
	}
	return pinned, missing
}

// pinScratch is a pin's working memory, reused from pin to pin (a
// 150-block query made three arrays of 150 for it): found, and the
// access that accessOf prepares.
type pinScratch struct {
	found []*Block
	acc   access
}

var pinScratches = sync.Pool{New: func() any { return new(pinScratch) }}

// maxPooledScratch bounds the chains whose scratch goes back to the pool.
const maxPooledScratch = 4096

// put clears sc (it must not keep blocks or keys alive) and pools it.
func (sc *pinScratch) put() {
	if cap(sc.found) > maxPooledScratch {
		return
	}
	clear(sc.found)
	clear(sc.acc.chain)
	clear(sc.acc.hints)
	sc.found, sc.acc.chain, sc.acc.ids, sc.acc.hints = sc.found[:0], sc.acc.chain[:0], sc.acc.ids[:0], sc.acc.hints[:0]
	pinScratches.Put(sc)
}

// pinFound is Pin's work on the pool alone: found[i] is key i's block,
// pinned, or nil; n counts the non-nil ones. found is sc's (nil sc: its
// own), valid until sc is put back.
func (s *Store) pinFound(c chain, sc *pinScratch) (found []*Block, n int) {
	if sc == nil {
		sc = new(pinScratch)
	}
	found = grow(sc.found, c.len())
	sc.found = found
	s.idxMu.RLock()
	n = c.lookup(&s.index, found)
	s.idxMu.RUnlock()
	pinGapHook()
	if n == 0 && c.len() < 2 {
		return found, 0
	}
	acc := s.accessOf(c, found, &sc.acc) // outside mu: it hashes the missing keys
	now := time.Now()
	newly := false
	s.mu.Lock()
	for i, b := range found {
		if b == nil {
			continue
		}
		if b.elem == nil { // removed since the lookup
			found[i] = nil
			acc.chain[i] = nil
			n--
			continue
		}
		if b.pins == 0 {
			s.pinned++
			s.pinnedSize += b.size
			newly = true
		}
		b.pins++
		b.lastAccess = now
		s.lru.MoveToFront(b.elem)
	}
	if newly {
		s.pinnedMetricLocked()
	}
	s.accessLocked(acc)
	s.mu.Unlock()
	return found, n
}

// Unpin drops one pin of each block; a block out of the index frees its
// memory on its last unpin. The gauges are set once, after the loop.
func (s *Store) Unpin(blocks []*Block) {
	s.mu.Lock()
	defer s.mu.Unlock()
	unpinned, freed := false, false
	for _, b := range blocks {
		u, f := s.unpinLocked(b)
		unpinned, freed = unpinned || u, freed || f
	}
	if unpinned {
		s.pinnedMetricLocked()
	}
	if freed {
		s.indexMetricsLocked()
	}
}

// unpinLocked drops one pin of b: unpinned when it was the last, freed
// when that freed b's memory reference (b was out of the index). The
// caller updates the gauges.
func (s *Store) unpinLocked(b *Block) (unpinned, freed bool) {
	if b == nil || b.ext.s != s || b.pins <= 0 {
		s.underflowLocked("Unpin of a block that is not pinned")
		return false, false
	}
	b.pins--
	if b.pins > 0 {
		return false, false
	}
	s.pinned--
	s.pinnedSize -= b.size
	if b.elem == nil { // out of the index: the pin was all that kept it
		s.deferred--
		s.unrefLocked(b.ext)
		return true, true
	}
	return true, false
}
