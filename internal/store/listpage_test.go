package store

import (
	"errors"
	"fmt"
	"testing"
)

// insertMany indexes n keys of ns, each one 64-byte slot, in extent e.
func insertMany(t *testing.T, s *Store, e *Extent, ns string, from, n int) {
	t.Helper()
	for i := from; i < from+n; i++ {
		if _, err := s.Insert(Key{Namespace: ns, Hash: fmt.Sprintf("%s-%06d", ns, i)}, e, []SlotLayout{{KLen: 64}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestListPageIndexedByNamespace (issue 15 item 4): a page of one
// namespace examines only that namespace's blocks, and a page of all
// examines about limit entries: never a walk over every block under the
// store lock.
func TestListPageIndexedByNamespace(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	e, err := s.AllocExtent(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer s.ReleaseExtent(e)
	insertMany(t, s, e, "small", 0, 3)
	insertMany(t, s, e, "big", 0, 20000)
	insertMany(t, s, e, "small", 3, 2)
	visited := 0
	old := listVisitHook
	listVisitHook = func() { visited++ }
	t.Cleanup(func() { listVisitHook = old })

	tests := []struct {
		ns         string
		limit      int
		want       int
		maxVisited int
	}{
		{"small", 10, 5, 5},
		{"", 10, 10, 11},
		{"big", 100, 100, 101},
		{"none", 10, 0, 0},
	}
	for _, tc := range tests {
		visited = 0
		infos, _ := s.ListPage(tc.ns, 0, tc.limit, 0)
		if len(infos) != tc.want || visited > tc.maxVisited {
			t.Errorf("ListPage(%q, limit %d): %d rows examining %d entries, want %d rows examining <= %d",
				tc.ns, tc.limit, len(infos), visited, tc.want, tc.maxVisited)
		}
	}
}

// TestListPageCursor: pages follow each other newest first with no
// block twice or missed, across deletes (holes and compaction) and
// inserts between pages; the slot bound ends a page early.
func TestListPageCursor(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	e, err := s.AllocExtent(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer s.ReleaseExtent(e)
	insertMany(t, s, e, "ns", 0, 500)
	insertMany(t, s, e, "other", 0, 100)
	deleted := map[string]bool{}
	seen := map[string]bool{}
	var cursor uint64
	last := "~"
	for page := 0; ; page++ {
		infos, next := s.ListPage("ns", cursor, 37, 0)
		for _, in := range infos {
			h := in.Key.Hash
			if seen[h] || deleted[h] || in.Key.Namespace != "ns" || h >= last {
				t.Fatalf("page %d: %s (seen %v, deleted %v, previous %s)", page, h, seen[h], deleted[h], last)
			}
			seen[h], last = true, h
		}
		if next == 0 {
			break
		}
		cursor = next
		// Between pages: delete 30 older blocks (forcing compaction) and
		// insert new ones (newer than the first page: not listed).
		for i := 0; i < 30; i++ {
			k := Key{Namespace: "ns", Hash: fmt.Sprintf("ns-%06d", (page*53+i*7)%500)}
			if !seen[k.Hash] && !deleted[k.Hash] {
				if _, err := s.Delete(k); err == nil {
					deleted[k.Hash] = true
				}
			}
		}
		insertMany(t, s, e, "ns", 1000+page*10, 10)
	}
	if len(seen)+len(deleted) != 500 {
		t.Fatalf("listed %d + deleted %d of 500", len(seen), len(deleted))
	}
	// The slot bound: blocks of 3 slots, at most 10 slots a page.
	s2, _ := newStore(t, 1<<20)
	e2, err := s2.AllocExtent(4096)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.ReleaseExtent(e2)
	for i := range 10 {
		if _, err := s2.Insert(Key{Namespace: "ns", Hash: fmt.Sprint(i)}, e2, []SlotLayout{{KLen: 8}, {KLen: 8}, {KLen: 8}}); err != nil {
			t.Fatal(err)
		}
	}
	if infos, next := s2.ListPage("", 0, 100, 10); len(infos) != 3 || next == 0 {
		t.Fatalf("slot-bounded page: %d rows, next %d; want 3 rows and a next page", len(infos), next)
	}
}

// TestReadPinnedNeedsAPin: ReadPinned reads the block it is given, and
// only while the caller holds a pin (else its memory may be reused).
func TestReadPinnedNeedsAPin(t *testing.T) {
	s, _ := newStore(t, 1<<20)
	k := Key{Namespace: "ns", Hash: "x"}
	mustPut(t, s, k, 1, SlotSize{KSize: 3000, VSize: 100})
	pinned, _ := s.Pin([]Key{k})
	b := pinned[0]
	var got []byte
	if err := s.ReadPinned(b, func(c []byte) error { got = append(got, c...); return nil }); err != nil {
		t.Fatal(err)
	}
	if want := pattern(1, 3100); string(got) != string(want) {
		t.Fatal("ReadPinned bytes differ from the put")
	}
	s.Unpin(pinned)
	if err := s.ReadPinned(b, func([]byte) error { return nil }); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ReadPinned without a pin: %v, want ErrInvalid", err)
	}
}
