package ssd

import "github.com/pegaflow/pegad/internal/store"

// The tier tells two subscribers which blocks it starts or stops
// holding, as the store does for the pool (store/events.go): the cluster
// index publisher (OnChange: it announces SSD-held blocks with their
// medium) and the KV-events publisher (OnEvents: BlockStored and
// BlockRemoved with medium "ssd"). A block is held from the moment its
// record is written and indexed until it is aged out, dropped (failed
// checksum or read) or forgotten (deleted).
//
// Both run under the tier's lock, so that events keep the tier's order;
// they must return at once and never call the tier (the publishers only
// note the key or append to a bounded queue).

// OnChange installs f (nil removes it), told the key of every block the
// tier starts or stops holding.
func (t *Tier) OnChange(f func(store.Key)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.onChange = f
}

// OnEvents installs f (nil removes it), handed the tier's changes in
// order, each with Lower set: Stored when a record is written, Evicted
// when it ages out or fails its read, Deleted when forgotten. Installing
// it hands f a Stored change for every block the tier holds already
// (found again at start), so a subscriber learns of them too.
func (t *Tier) OnEvents(f func([]store.Change)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.onEvents = f
	if f == nil || len(t.index) == 0 {
		return
	}
	held := make([]store.Change, 0, len(t.index))
	for k := range t.index {
		held = append(held, store.Change{Key: k, Kind: store.Stored, Lower: true})
	}
	f(held)
}

// emitLocked tells the subscribers of keys changed by kind.
func (t *Tier) emitLocked(kind store.ChangeKind, keys ...store.Key) {
	if len(keys) == 0 {
		return
	}
	if t.onChange != nil {
		for _, k := range keys {
			t.onChange(k)
		}
	}
	if t.onEvents != nil {
		changes := make([]store.Change, len(keys))
		for i, k := range keys {
			changes[i] = store.Change{Key: k, Kind: kind, Lower: true}
		}
		t.onEvents(changes)
	}
}
