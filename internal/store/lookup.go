package store

// Prefix is the number of keys, from the first, that are indexed one after
// another: the length of the stored prefix of a chain. It pins nothing and
// touches no block's LRU place (a scheduler asks many times before it
// loads once; asking must not keep blocks warm).
func (s *Store) Prefix(keys []Key) int {
	s.idxMu.RLock()
	defer s.idxMu.RUnlock()
	for i, k := range keys {
		if s.index.get(k) == nil {
			return i
		}
	}
	return len(keys)
}

// PrefixOf is Prefix of the chain hashes in namespace ns, without building
// a key per hash: the namespace's map is found once, and each hash is then
// one lookup of its bytes (m[string(h)] neither allocates nor copies). A
// scheduler's LOOKUP of a 1,000-hash chain so makes no allocation and no
// (namespace, hash) hashing per hash (docs/performance.md). Like Prefix it
// changes nothing: no LRU place, no policy access, no store lock.
func (s *Store) PrefixOf(ns string, hashes [][]byte) int {
	s.idxMu.RLock()
	defer s.idxMu.RUnlock()
	m := s.index.namespace(ns)
	for i, h := range hashes {
		if _, ok := m[string(h)]; !ok {
			return i
		}
	}
	return len(hashes)
}
