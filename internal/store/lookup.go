package store

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
