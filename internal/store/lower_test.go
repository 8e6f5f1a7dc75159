package store

import (
	"bytes"
	"context"
	"sync"
	"testing"
)

// fakeLower is a Lower in memory: what it holds, by key.
type fakeLower struct {
	mu     sync.Mutex // guards blocks
	blocks map[Key]fakeBlock
}

type fakeBlock struct {
	sizes []SlotSize
	data  []byte
}

func newFakeLower() *fakeLower { return &fakeLower{blocks: map[Key]fakeBlock{}} }

func (l *fakeLower) hold(k Key, sizes []SlotSize, data []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.blocks[k] = fakeBlock{sizes: sizes, data: data}
}

func (l *fakeLower) Spill(Key, []SlotSize, uint64, func([]byte)) {}

func (l *fakeLower) SpillWait(context.Context, Key, []SlotSize, uint64, func([]byte)) error {
	return nil
}

func (l *fakeLower) Has(k Key) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.blocks[k]
	return ok
}

// Load hands the block to use with the fake's lock released, as the SSD
// tier does.
func (l *fakeLower) Load(k Key, use func([]SlotSize, []byte) error) error {
	l.mu.Lock()
	b, ok := l.blocks[k]
	l.mu.Unlock()
	if !ok {
		return ErrNotFound
	}
	return use(b.sizes, b.data)
}

func (l *fakeLower) Forget(k Key) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.blocks[k]
	delete(l.blocks, k)
	return ok
}

// TestDeleteDuringPromotionWins: a key only on the lower tier is deleted
// between the tier's read and the Put that puts it back into the pool
// (issue 33, defect 2). The Delete succeeds, and the promotion must not
// resurrect the block: the reader reports it missing, nothing is indexed,
// and a re-put of the key with new bytes is stored and read back. Both
// promotion paths: Pin (every reader) and Promote (prefetch).
func TestDeleteDuringPromotionWins(t *testing.T) {
	for _, via := range []string{"Pin", "Promote"} {
		t.Run(via, func(t *testing.T) {
			s, _ := newStore(t, 1<<20)
			low := newFakeLower()
			s.SetLower(low, nil)
			sz := SlotSize{KSize: 4 * kib, VSize: 4 * kib}
			k := key(1)
			low.hold(k, []SlotSize{sz}, pattern(1, total([]SlotSize{sz})))

			hooked := false
			promoteGapHook = func() {
				if hooked {
					return
				}
				hooked = true
				if _, err := s.Delete(k); err != nil {
					t.Errorf("Delete during the promotion: %v", err)
				}
			}
			t.Cleanup(func() { promoteGapHook = func() {} })

			switch via {
			case "Pin":
				pinned, missing := s.Pin([]Key{k})
				s.Unpin(pinned)
				if len(pinned) != 0 || len(missing) != 1 {
					t.Errorf("Pin after a delete during its promotion: %d pinned, missing %v; want it missing", len(pinned), missing)
				}
			case "Promote":
				if n := s.Promote([]Key{k}); n != 0 {
					t.Errorf("Promote after a delete during its promotion = %d, want 0", n)
				}
			}
			if !hooked {
				t.Fatal("the promotion gap hook did not run")
			}
			if s.Has(k) || low.Has(k) {
				t.Fatalf("deleted during its promotion, the block came back: in the pool %v, on the tier %v", s.Has(k), low.Has(k))
			}
			if st := s.Stats(); st.Blocks != 0 || st.Pool.Used != 0 || st.Pinned != 0 {
				t.Fatalf("stats %+v: want nothing indexed, allocated or pinned", st)
			}
			s.mu.Lock()
			left := len(s.promoting)
			s.mu.Unlock()
			if left != 0 {
				t.Fatalf("%d promotions still registered", left)
			}
			// A re-put with new bytes is a new block, not "already indexed".
			mustPut(t, s, k, 2, sz)
			if got, _ := readAll(t, s, k); !bytes.Equal(got, pattern(2, total([]SlotSize{sz}))) {
				t.Fatal("re-put after the delete reads back other bytes")
			}
		})
	}
}

// TestPromotionWithoutDelete: the guard costs nothing when no Delete
// races: a key only on the lower tier is promoted and pinned with its
// bytes, and a Delete of another key meanwhile does not cancel it.
func TestPromotionWithoutDelete(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	low := newFakeLower()
	s.SetLower(low, nil)
	sz := SlotSize{KSize: 8 * kib}
	low.hold(key(1), []SlotSize{sz}, pattern(1, 8*kib))
	mustPut(t, s, key(2), 2, sz)
	promoteGapHook = func() {
		if _, err := s.Delete(key(2)); err != nil {
			t.Errorf("Delete of another key: %v", err)
		}
	}
	t.Cleanup(func() { promoteGapHook = func() {} })
	pinned, missing := s.Pin([]Key{key(1)})
	if len(pinned) != 1 || len(missing) != 0 {
		t.Fatalf("Pin: %d pinned, missing %v; want the promoted block", len(pinned), missing)
	}
	if !bytes.Equal(blockBytes(pinned[0]), pattern(1, 8*kib)) {
		t.Fatal("promoted block has other bytes")
	}
	s.Unpin(pinned)
}
