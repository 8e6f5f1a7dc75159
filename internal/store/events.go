package store

// Change notification: the store tells two subscribers what entered or
// left its index.
//
// OnChange (the daemon's cluster-index publisher) learns which keys were
// indexed or left the index, so the cluster can learn what this node
// holds. It is called after the store's lock is released, never under it,
// so it may take its own locks or call back into the store. It only
// learns that a key changed, not how: it asks Has for the current truth,
// which makes the order in which two goroutines' notifications arrive
// irrelevant.
//
// OnEvents (the KV-events publisher) learns how each key changed (stored,
// evicted, deleted), in the store's own order: routers replay the events
// as a log, so a delete must never overtake the put it undoes. That order
// exists only under the lock, so this hook runs under it, once per
// locked section, and must only hand the slice over (a bounded queue that
// drops when full): it must not block, take a lock that is ever held
// while calling into the store, or call the store.

// ChangeKind says how a key changed.
type ChangeKind uint8

// Kinds of change.
const (
	Stored  ChangeKind = iota + 1 // inserted into the index
	Evicted                       // removed to make room
	Deleted                       // removed by Delete
)

func (k ChangeKind) String() string {
	switch k {
	case Stored:
		return "stored"
	case Evicted:
		return "evicted"
	case Deleted:
		return "deleted"
	}
	return "unknown"
}

// Change is one key entering or leaving the index.
type Change struct {
	Key  Key
	Kind ChangeKind
	// Lower: the change is of the lower tier's copy (the SSD tier wrote,
	// aged out, dropped or forgot the block; internal/ssd), not the pool's.
	Lower bool
}

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

// OnEvents installs f as the ordered event subscriber (nil removes it).
// f runs under the store's lock with the changes of one locked section,
// in order; the slice is f's to keep (the store only reads it after f
// returns). f must return at once (see the file comment).
func (s *Store) OnEvents(f func([]Change)) {
	if f == nil {
		s.onEvents.Store(nil)
		return
	}
	s.onEvents.Store(&f)
}

// changedLocked records that key entered or left the index.
func (s *Store) changedLocked(k Key, kind ChangeKind) {
	if s.onChange.Load() != nil || s.onEvents.Load() != nil {
		s.changed = append(s.changed, Change{Key: k, Kind: kind})
	}
}

// unlockNotify hands the changes made while mu was held to the ordered
// subscriber, releases mu, and then tells the key subscriber.
func (s *Store) unlockNotify() {
	changes := s.changed
	s.changed = nil
	if f := s.onEvents.Load(); f != nil && len(changes) > 0 {
		(*f)(changes)
	}
	s.mu.Unlock()
	if f := s.onChange.Load(); f != nil {
		for _, c := range changes {
			(*f)(c.Key)
		}
	}
}

// Keys lists every indexed key (a subscriber's full resync), copying only
// the keys while the lock is held.
func (s *Store) Keys() []Key {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]Key, 0, s.index.len())
	for k := range s.index.all() {
		keys = append(keys, k)
	}
	return keys
}
