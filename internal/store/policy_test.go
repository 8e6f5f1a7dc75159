package store

import (
	"testing"

	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"
)

// newPolicyStore is a store of blocks 64K each, room for n of them, whose
// eviction policy is kind.
func newPolicyStore(t *testing.T, kind evict.Kind, n int) *Store {
	t.Helper()
	s, _ := newPolicyStoreMetrics(t, kind, n)
	return s
}

func newPolicyStoreMetrics(t *testing.T, kind evict.Kind, n int) (*Store, *metrics.Metrics) {
	t.Helper()
	p, err := pool.New(pool.Options{Size: uint64(n) * 64 * kib, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	m := metricstest.New()
	return NewWithPolicy(p, m, NewPolicy(kind)), m
}

// putFetched stores k as a copy fetched from a peer.
func putFetched(t *testing.T, s *Store, k Key) {
	t.Helper()
	e, err := s.AllocExtent(64 * kib)
	if err != nil {
		t.Fatal(err)
	}
	defer s.ReleaseExtent(e)
	if _, err := s.InsertFetched(k, e, []SlotLayout{{KLen: 64 * kib}}); err != nil {
		t.Fatal(err)
	}
}

// evictedBy puts fresh blocks one at a time and returns, per put, the keys
// among watch that left the index.
func evictedBy(t *testing.T, s *Store, puts int, watch []Key) []Key {
	t.Helper()
	var gone []Key
	left := map[Key]bool{}
	for i := 0; i < puts; i++ {
		mustPut(t, s, key(1000+i), 1000+i, SlotSize{KSize: 64 * kib})
		for _, k := range watch {
			if !left[k] && !s.Has(k) {
				left[k] = true
				gone = append(gone, k)
			}
		}
	}
	return gone
}

// TestFetchedCopiesEvictedFirst: a block fetched from a peer (which holds
// it too) goes before every block only this node holds, under both
// policies, even when it is the most recent.
func TestFetchedCopiesEvictedFirst(t *testing.T) {
	for _, kind := range evict.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			s := newPolicyStore(t, kind, 4)
			own := []Key{key(0), key(1), key(2)}
			for i, k := range own {
				mustPut(t, s, k, i, SlotSize{KSize: 64 * kib})
			}
			putFetched(t, s, key(3))
			gone := evictedBy(t, s, 1, append(own, key(3)))
			if len(gone) != 1 || gone[0] != key(3) {
				t.Fatalf("evicted %v, want only the fetched copy %v", gone, key(3))
			}
			if _, info := readAll(t, s, key(0)); info.Fetched {
				t.Fatalf("an own block listed as fetched")
			}
		})
	}
}

// TestChainTailEvictedBeforeHead: a chain looked up (so the store learns
// its order) then put is evicted tail first under prefix and adaptive,
// whereas LRU drops the head first (it was put first) and so breaks the
// whole chain.
func TestChainTailEvictedBeforeHead(t *testing.T) {
	chain := []Key{key(0), key(1), key(2)}
	cases := []struct {
		kind evict.Kind
		want []Key // eviction order
	}{
		{evict.KindPrefix, []Key{key(2), key(1), key(0)}},
		{evict.KindAdaptive, []Key{key(2), key(1), key(0)}},
		{evict.KindLRU, []Key{key(0), key(1), key(2)}},
	}
	for _, c := range cases {
		t.Run(string(c.kind), func(t *testing.T) {
			s := newPolicyStore(t, c.kind, 4)
			if pinned, missing := s.Pin(chain); len(pinned) != 0 || len(missing) != 3 {
				t.Fatalf("fresh store: pinned %d, missing %d", len(pinned), len(missing))
			}
			for i, k := range chain {
				mustPut(t, s, k, i, SlotSize{KSize: 64 * kib})
			}
			gone := evictedBy(t, s, 4, chain)
			if len(gone) != len(c.want) {
				t.Fatalf("evicted %v, want %v", gone, c.want)
			}
			for i := range gone {
				if gone[i] != c.want[i] {
					t.Fatalf("evicted %v, want %v", gone, c.want)
				}
			}
		})
	}
}

// TestPolicyStats: the store reports the policy it runs.
func TestPolicyStats(t *testing.T) {
	for _, kind := range evict.Kinds {
		s := newPolicyStore(t, kind, 2)
		if got := s.PolicyStats().Policy; got != string(kind) {
			t.Errorf("policy %q, want %q", got, kind)
		}
	}
}

// TestEvictedBytes: a 128K put into a full pool of 64K blocks evicts
// adjacent ones: under lru and prefix two (128K for 128K needed), under
// adaptive three, since its order is 3 (the window's block loses its
// duel with main's victim 0: neither was hit), 0, 1, and 3 is not next
// to 0-1 (64K is left free). Stats and the metric agree.
func TestEvictedBytes(t *testing.T) {
	for _, kind := range evict.Kinds {
		t.Run(string(kind), func(t *testing.T) {
			blocks := uint64(2)
			if kind == evict.KindAdaptive {
				blocks = 3
			}
			s, m := newPolicyStoreMetrics(t, kind, 4)
			for i := range 4 {
				mustPut(t, s, key(i), i, SlotSize{KSize: 64 * kib})
			}
			mustPut(t, s, key(9), 9, SlotSize{KSize: 128 * kib})
			st := s.Stats()
			if st.EvictedBytes != blocks*64*kib || st.EvictNeedBytes != 128*kib || st.Evictions != blocks {
				t.Fatalf("evicted %d bytes in %d blocks for %d needed; want %d blocks for 128K", st.EvictedBytes, st.Evictions, st.EvictNeedBytes, blocks)
			}
			if got := testutil.ToFloat64(m.EvictedBytes); got != float64(blocks*64*kib) {
				t.Fatalf("pegaflow_block_evicted_bytes_total %v", got)
			}
			if got := s.Pool().Stats().FreeSpans; got != int(blocks-2) {
				t.Fatalf("free spans %d, want %d (what the evictions left over the put)", got, blocks-2)
			}
		})
	}
}
