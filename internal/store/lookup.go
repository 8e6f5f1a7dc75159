package store

import "unsafe"

// Prefix is the number of keys, from the first, that are indexed one after
// another: the length of the stored prefix of a chain. It pins nothing and
// touches no block's LRU place (a scheduler asks many times before it
// loads once; asking must not keep blocks warm).
func (s *Store) Prefix(keys []Key) int {
	s.idxMu.RLock()
	defer s.idxMu.RUnlock()
	for i, k := range keys {
		if _, ok := s.index[k]; !ok {
			return i
		}
	}
	return len(keys)
}

// PrefixOf is Prefix of the chain hashes in namespace ns, without building
// a key per hash: a scheduler's lookup of a 1,000-hash chain makes no
// allocation per hash (it measured 3.6 × an empty round trip after this,
// 5.4 × before; docs/performance.md).
func (s *Store) PrefixOf(ns string, hashes [][]byte) int {
	s.idxMu.RLock()
	defer s.idxMu.RUnlock()
	for i, h := range hashes {
		// The key only lives for the map lookup and h is not written
		// meanwhile: a string header over h's bytes is safe here.
		k := Key{Namespace: ns, Hash: unsafe.String(unsafe.SliceData(h), len(h))}
		if _, ok := s.index[k]; !ok {
			return i
		}
	}
	return len(hashes)
}
