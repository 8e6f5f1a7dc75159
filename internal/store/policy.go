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
	case evict.KindAdaptive:
		return evict.NewAdaptive()
	}
	return evict.NewPrefix()
}

// maxHints bounds the parent hints kept between a lookup and the puts
// that follow it; past it they are dropped all at once (a chain whose
// hints go is inserted without parents: ranked alone, never wrong).
const maxHints = 1 << 16

// hintLocked records, for each key of a looked-up chain that is missing,
// the key before it: when the engine then puts that block, Insert finds
// its parent. Chains are learnt only from lookups that pin (Pin); the
// prefix queries (Prefix, PrefixOf) take no store lock and teach nothing.
func (s *Store) hintLocked(keys []Key, found []*Block) {
	for i := 1; i < len(keys); i++ {
		if found[i] != nil {
			continue
		}
		if len(s.hints) >= maxHints {
			clear(s.hints)
		}
		s.hints[keys[i]] = keys[i-1]
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

// accessLocked tells the policy about a looked-up chain (found[i]: keys[i]'s
// block, nil when missing).
func (s *Store) accessLocked(keys []Key, found []*Block) {
	chain, ids := s.chain[:0], s.chainIDs[:0]
	for i, b := range found {
		if b != nil {
			chain = append(chain, &b.node)
			ids = append(ids, b.node.ID)
		} else {
			chain = append(chain, nil)
			ids = append(ids, keyID(keys[i]))
		}
	}
	s.policy.Access(chain, ids)
	clear(chain)
	s.chain, s.chainIDs = chain[:0], ids[:0]
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

// PolicyStats is the eviction policy's report (admin stats).
func (s *Store) PolicyStats() evict.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.policy.Stats()
}
