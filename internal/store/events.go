package store

// Change notification: the store tells one subscriber (the daemon's
// cluster-index publisher) which keys were indexed or left the index, so
// the cluster can learn what this node holds. The subscriber is called
// after the store's lock is released, never under it, so it may take its
// own locks or call back into the store. It only learns that a key
// changed, not how: it asks Has for the current truth, which makes the
// order in which two goroutines' notifications arrive irrelevant.

// OnChange installs f as the change subscriber (nil removes it). f runs
// on the goroutine that changed the store, outside the store's lock, once
// per key inserted, deleted or evicted; it must not block.
func (s *Store) OnChange(f func(Key)) {
	if f == nil {
		s.onChange.Store(nil)
		return
	}
	s.onChange.Store(&f)
}

// changedLocked records that key entered or left the index.
func (s *Store) changedLocked(k Key) {
	if s.onChange.Load() != nil {
		s.changed = append(s.changed, k)
	}
}

// unlockNotify releases mu and then tells the subscriber about the keys
// changed while it was held.
func (s *Store) unlockNotify() {
	keys := s.changed
	s.changed = nil
	s.mu.Unlock()
	if f := s.onChange.Load(); f != nil {
		for _, k := range keys {
			(*f)(k)
		}
	}
}

// Keys lists every indexed key (a subscriber's full resync), copying only
// the keys while the lock is held.
func (s *Store) Keys() []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]Key, 0, len(s.index))
	for k := range s.index {
		keys = append(keys, k)
	}
	return keys
}
