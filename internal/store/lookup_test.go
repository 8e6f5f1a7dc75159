package store

import (
	"fmt"
	"slices"
	"testing"

	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/rs/zerolog"
)

// victimOrder is the store's eviction order (the policy's Walk) and its
// listing order (the LRU list), as keys.
func victimOrder(t *testing.T, s *Store) (walk, lru []Key) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.policy.Walk(func(n *evict.Node) bool {
		walk = append(walk, n.Value.(*Block).key)
		return true
	})
	for el := s.lru.Front(); el != nil; el = el.Next() {
		lru = append(lru, el.Value.(*Block).key)
	}
	return walk, lru
}

// TestPrefixLeavesEvictionOrder: Prefix and PrefixOf, the LOOKUP path,
// change neither the policy's victim order nor the listing order, under
// every policy; a Pin of the same chain (LOOKUP_PIN) does, so the check
// can see a change.
func TestPrefixLeavesEvictionOrder(t *testing.T) {
	for _, kind := range evict.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			s := newPolicyStore(t, kind, 16)
			var keys []Key
			var hashes [][]byte
			for i := range 8 {
				mustPut(t, s, key(i), i, SlotSize{KSize: 64 * kib})
				keys = append(keys, key(i))
				hashes = append(hashes, []byte(key(i).Hash))
			}
			walk, lru := victimOrder(t, s)
			for range 50 { // the oldest blocks, asked for again and again
				if n := s.PrefixOf("ns", hashes[:3]); n != 3 {
					t.Fatalf("PrefixOf = %d, want 3", n)
				}
				if n := s.Prefix(append(keys[:2:2], key(99))); n != 2 {
					t.Fatalf("Prefix = %d, want 2", n)
				}
			}
			if w, l := victimOrder(t, s); !slices.Equal(w, walk) || !slices.Equal(l, lru) {
				t.Fatalf("lookups moved blocks:\nwalk %v\nnow  %v\nlru  %v\nnow  %v", walk, w, lru, l)
			}
			pinned, _ := s.Pin(keys[:3])
			s.Unpin(pinned)
			if _, l := victimOrder(t, s); slices.Equal(l, lru) {
				t.Fatal("a Pin of the chain left the LRU order as it was: the check cannot see a change")
			}
		})
	}
}

// TestPrefixOfAllocs: a lookup of a long chain allocates nothing, found
// or not, and in a namespace that holds nothing.
func TestPrefixOfAllocs(t *testing.T) {
	s := newPolicyStore(t, evict.KindLRU, 64)
	hashes := make([][]byte, 64)
	for i := range hashes {
		mustPut(t, s, key(i), i, SlotSize{KSize: 64 * kib})
		hashes[i] = []byte(key(i).Hash)
	}
	missing := append(hashes[:32:32], []byte("absent"))
	tests := []struct {
		name   string
		ns     string
		hashes [][]byte
		want   int
	}{
		{"all stored", "ns", hashes, 64},
		{"a miss at 32", "ns", missing, 32},
		{"unknown namespace", "other", hashes, 0},
	}
	for _, tc := range tests {
		var n int
		if a := testing.AllocsPerRun(100, func() { n = s.PrefixOf(tc.ns, tc.hashes) }); a != 0 {
			t.Errorf("%s: %.1f allocations per PrefixOf, want 0", tc.name, a)
		}
		if n != tc.want {
			t.Errorf("%s: PrefixOf = %d, want %d", tc.name, n, tc.want)
		}
	}
}

// TestIndexPerNamespace: the same hash in two namespaces is two blocks;
// removing one leaves the other, and a namespace whose last block goes
// leaves no map behind.
func TestIndexPerNamespace(t *testing.T) {
	s := newPolicyStore(t, evict.KindLRU, 8)
	a, b := Key{Namespace: "a", Hash: "h"}, Key{Namespace: "b", Hash: "h"}
	mustPut(t, s, a, 1, SlotSize{KSize: 64 * kib})
	mustPut(t, s, b, 2, SlotSize{KSize: 64 * kib})
	if n := s.PrefixOf("a", [][]byte{[]byte("h")}); n != 1 || s.Stats().Blocks != 2 {
		t.Fatalf("PrefixOf(a) = %d, %d blocks; want 1, 2", n, s.Stats().Blocks)
	}
	if _, err := s.Delete(a); err != nil {
		t.Fatal(err)
	}
	if s.Has(a) || !s.Has(b) || s.Stats().Blocks != 1 {
		t.Fatalf("after deleting a: has a %v, has b %v, %d blocks", s.Has(a), s.Has(b), s.Stats().Blocks)
	}
	s.mu.Lock()
	maps := len(s.index.byNS)
	s.mu.Unlock()
	if maps != 1 {
		t.Fatalf("%d namespace maps for one namespace", maps)
	}
}

// BenchmarkPrefixOf1000: the index walk of a 1,000-hash LOOKUP of
// 32-byte hashes, every block stored: the daemon's share of the round
// trip that bench's BenchmarkLookupChainVsEmpty times whole.
func BenchmarkPrefixOf1000(b *testing.B) {
	const blocks = 1000
	p, err := pool.New(pool.Options{Size: blocks * pool.Alignment, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = p.Close() })
	s := New(p, nil)
	hashes := make([][]byte, blocks)
	for i := range hashes {
		hashes[i] = fmt.Appendf(nil, "%032x", i)
		mustPut(b, s, Key{Namespace: "bench@tp0", Hash: string(hashes[i])}, i, SlotSize{KSize: 1})
	}
	b.ReportAllocs()
	for b.Loop() {
		if n := s.PrefixOf("bench@tp0", hashes); n != blocks {
			b.Fatalf("PrefixOf = %d, want %d", n, blocks)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/blocks, "ns/hash")
}
