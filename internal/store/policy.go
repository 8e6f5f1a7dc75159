package store

import (
	"hash/maphash"

	"github.com/pegaflow/pegad/internal/evict"
)

// Policy orders the indexed blocks for eviction (internal/evict holds the
// policies). The store calls it under its lock, for every indexed block:
// Insert when a block enters the index (parent: the block before it in
// its chain when the store knows it; fetched: a copy from another node,
// which that node holds too), Access with the blocks of a looked-up chain
// in chain order (nil where a key is missing) and the ids of all its keys
// (Node.ID's hash, found or not: a policy may count the misses), Remove when a block leaves
// the index. Walk yields blocks first victim first, changing nothing; the
// store skips pinned ones and plans contiguous room from the rest
// (planEvictionLocked). A policy must not call the store.
type Policy interface {
	Name() string
	Insert(n, parent *evict.Node, fetched bool)
	Access(chain []*evict.Node, ids []uint64)
	Remove(n *evict.Node)
	Walk(yield func(*evict.Node) bool)
	Len() int
	Stats() evict.Stats
}

// NewPolicy makes the policy kind names.
func NewPolicy(k evict.Kind) Policy {
	switch k {
	case evict.KindLRU:
		return evict.NewLRU()
	case evict.KindPrefix:
		return evict.NewPrefix()
	}
	return evict.NewAdaptive()
}

// maxHints bounds the parent hints kept between a lookup and the puts
// that follow it; past it they are dropped all at once (a chain whose
// hints go is inserted without parents: ranked alone, never wrong).
const maxHints = 1 << 16

// access is what a pinned chain tells the policy and the hints, made
// ready before mu is taken (accessOf): chain[i] is block i's node (nil:
// missing), ids[i] its key's id (Policy.Access), and hints the pairs
// (missing key, the key before it) to record.
type access struct {
	chain []*evict.Node
	ids   []uint64
	hints []Key
}

// accessOf prepares the access of c, whose blocks found holds (nil:
// missing), with no lock held: it hashes each missing key for its id and
// makes the strings of the hints, work that was per block under mu.
//
// A hint records, for each key of a looked-up chain that is missing, the
// key before it: when the engine then puts that block, Insert finds its
// parent. Chains are learnt only from lookups that pin (Pin); the prefix
// queries (Prefix, PrefixOf) take no store lock and teach nothing.
func (s *Store) accessOf(c chain, found []*Block, a *access) access {
	a.chain, a.ids, a.hints = grow(a.chain, len(found)), grow(a.ids, len(found)), a.hints[:0]
	made, madeAt := Key{}, -1
	key := func(i int) Key { // a run of missing keys makes each string once
		if i != madeAt {
			made, madeAt = c.key(i), i
		}
		return made
	}
	for i, b := range found {
		if b != nil {
			a.chain[i], a.ids[i] = &b.node, b.node.ID // ID is keyID(b.key), set before insertion
			continue
		}
		a.ids[i] = c.id(i)
		if i > 0 {
			parent := key(i - 1)
			a.hints = append(a.hints, key(i), parent)
		}
	}
	return *a
}

// grow is buf resized to n zero elements, reusing its array when it has room.
func grow[T any](buf []T, n int) []T {
	if cap(buf) < n {
		return make([]T, n)
	}
	buf = buf[:n]
	clear(buf)
	return buf
}

// accessLocked tells the policy about a pinned chain and records its
// hints. A block removed since accessOf is told as missing (pinFound has
// cleared its chain entry); it gets no hint, as if it had been removed
// just after the pin.
func (s *Store) accessLocked(a access) {
	s.policy.Access(a.chain, a.ids)
	for j := 0; j < len(a.hints); j += 2 {
		if len(s.hints) >= maxHints {
			clear(s.hints)
		}
		s.hints[a.hints[j]] = a.hints[j+1]
	}
}

// parentLocked is the node of key's parent per the hints, or nil; the
// hint is used up.
func (s *Store) parentLocked(key Key) *evict.Node {
	pk, ok := s.hints[key]
	if !ok {
		return nil
	}
	delete(s.hints, key)
	if p := s.index.get(pk); p != nil {
		return &p.node
	}
	return nil
}

var keySeed = maphash.MakeSeed()

// keyID is the hash the policy's frequency sketch counts key under.
func keyID(k Key) uint64 {
	var h maphash.Hash
	h.SetSeed(keySeed)
	h.WriteString(k.Namespace)
	h.WriteByte(0)
	h.WriteString(k.Hash)
	return h.Sum64()
}

// hashID is keyID of {ns, hash}, without the Key.
func hashID(ns string, hash []byte) uint64 {
	var h maphash.Hash
	h.SetSeed(keySeed)
	h.WriteString(ns)
	h.WriteByte(0)
	h.Write(hash)
	return h.Sum64()
}

// PolicyStats is the eviction policy's report (admin stats).
func (s *Store) PolicyStats() evict.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policy.Stats()
}
