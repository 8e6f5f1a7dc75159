package holder

import "encoding/binary"

// idTable is a shard's index of live sessions by id: an open-addressing
// hash table (linear probing, backward-shift deletion) of session
// pointers. It replaces a map[sessionID]*session because the key already
// lives in the session record: a slot is 8 bytes instead of a map slot's
// 24 plus control bytes (issue 11.5 counts every byte of a million
// sessions). Ids are random bytes the holder draws itself, so their bytes
// are the hash and no input can crowd one probe run. Not safe for
// concurrent use (the shard's mu guards it); do not add or remove while
// walking it with each.
type idTable struct {
	slots []*session // nil or a power of two long; nil entries are free
	n     int
}

const idTableMin = 8

func (t *idTable) home(id sessionID) int {
	return int(binary.LittleEndian.Uint64(id[8:]) & uint64(len(t.slots)-1))
}

func (t *idTable) len() int { return t.n }

// get returns the live session with id, or nil.
func (t *idTable) get(id sessionID) *session {
	if t.n == 0 {
		return nil
	}
	mask := len(t.slots) - 1
	for i := t.home(id); ; i = (i + 1) & mask {
		s := t.slots[i]
		if s == nil || s.id == id {
			return s
		}
	}
}

// put adds s, whose id must not be in t. It grows past a load of 7/8.
func (t *idTable) put(s *session) {
	if (t.n+1)*8 > len(t.slots)*7 {
		t.resize(max(idTableMin, 2*len(t.slots)))
	}
	t.place(s)
	t.n++
}

func (t *idTable) place(s *session) {
	mask := len(t.slots) - 1
	i := t.home(s.id)
	for t.slots[i] != nil {
		i = (i + 1) & mask
	}
	t.slots[i] = s
}

// del removes the session with id; false when none. Entries after it in
// its probe run shift back so that no tombstones are needed; below a load
// of 1/8 the table halves, so a spike of sessions does not keep its
// memory.
func (t *idTable) del(id sessionID) bool {
	if t.n == 0 {
		return false
	}
	mask := len(t.slots) - 1
	i := t.home(id)
	for {
		s := t.slots[i]
		if s == nil {
			return false
		}
		if s.id == id {
			break
		}
		i = (i + 1) & mask
	}
	// Backward shift: move each later entry of the run into the hole
	// when its home is not cyclically in (hole, its slot].
	for j := (i + 1) & mask; t.slots[j] != nil; j = (j + 1) & mask {
		k := t.home(t.slots[j].id)
		if (j > i && (k <= i || k > j)) || (j < i && k <= i && k > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = nil
	t.n--
	if len(t.slots) > idTableMin && t.n*8 < len(t.slots) {
		t.resize(len(t.slots) / 2)
	}
	return true
}

func (t *idTable) resize(size int) {
	old := t.slots
	t.slots = make([]*session, size)
	for _, s := range old {
		if s != nil {
			t.place(s)
		}
	}
}

// each calls f for every session, in no order.
func (t *idTable) each(f func(s *session)) {
	for _, s := range t.slots {
		if s != nil {
			f(s)
		}
	}
}
