package store

import (
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
	"github.com/rs/zerolog"
)

const blk = 4 * kib // every quota test block: one 4 KiB K segment

func nsKey(ns string, i int) Key { return Key{Namespace: ns, Hash: fmt.Sprintf("h%04d", i)} }

func putBlk(t testing.TB, s *Store, k Key, n uint64) error {
	t.Helper()
	_, err := s.Put(k, []SlotSize{{KSize: n}}, func([]byte) error { return nil })
	return err
}

func mustPutBlk(t testing.TB, s *Store, k Key) {
	t.Helper()
	if err := putBlk(t, s, k, blk); err != nil {
		t.Fatalf("Put(%v): %v", k, err)
	}
}

func setQuotas(t testing.TB, s *Store, qs ...Quota) {
	t.Helper()
	if err := s.SetQuotas(qs); err != nil {
		t.Fatalf("SetQuotas(%v): %v", qs, err)
	}
}

// quotaOf is the snapshot of the quota with prefix p.
func quotaOf(t testing.TB, s *Store, p string) QuotaStats {
	t.Helper()
	for _, q := range s.Quotas() {
		if q.Prefix == p {
			return q
		}
	}
	t.Fatalf("no quota %q in %v", p, s.Quotas())
	return QuotaStats{}
}

func newPolicyStoreSized(t testing.TB, kind evict.Kind, size uint64) (*Store, *metrics.Metrics) {
	t.Helper()
	p, err := pool.New(pool.Options{Size: size, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	m := metricstest.New()
	return NewWithPolicy(p, m, NewPolicy(kind)), m
}

// TestQuotaLongestPrefixWins: a namespace counts against the longest
// quota prefix it starts with, and against nothing when none matches.
func TestQuotaLongestPrefixWins(t *testing.T) {
	s, _ := newStore(t, 64*blk)
	setQuotas(t, s, Quota{"m", 32 * blk}, Quota{"m/a", 16 * blk}, Quota{"m/a/x", 8 * blk})
	for _, tc := range []struct {
		ns    string
		quota string // "": none
	}{
		{"m/a/x", "m/a/x"},
		{"m/a/x/y", "m/a/x"},
		{"m/a/y", "m/a"},
		{"m/a", "m/a"},
		{"m/b", "m"},
		{"m", "m"},
		{"n/a", ""},
		{"xm/a", ""},
	} {
		t.Run(tc.ns, func(t *testing.T) {
			before := map[string]uint64{}
			for _, q := range s.Quotas() {
				before[q.Prefix] = q.Used
			}
			mustPutBlk(t, s, nsKey(tc.ns, 0))
			for _, q := range s.Quotas() {
				want := before[q.Prefix]
				if q.Prefix == tc.quota {
					want += blk
				}
				if q.Used != want {
					t.Errorf("quota %q used %d after a put in %q, want %d", q.Prefix, q.Used, tc.ns, want)
				}
			}
		})
	}
}

// TestQuotaOwnEviction: a namespace at its quota evicts its own blocks,
// oldest first (lru), and no other namespace's, whether the pool has room
// or is full.
func TestQuotaOwnEviction(t *testing.T) {
	for _, tc := range []struct {
		name string
		pool uint64 // blocks
	}{
		{"pool has room", 64},
		{"pool full", 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, m := newStore(t, tc.pool*blk)
			setQuotas(t, s, Quota{"a", 4 * blk})
			for i := range 4 {
				mustPutBlk(t, s, nsKey("b", i))
				mustPutBlk(t, s, nsKey("a", i))
			}
			for i := 4; i < 10; i++ {
				mustPutBlk(t, s, nsKey("a", i))
				q := quotaOf(t, s, "a")
				if q.Used != 4*blk || q.Blocks != 4 {
					t.Fatalf("after a/%d: quota used %d in %d blocks, want %d in 4", i, q.Used, q.Blocks, 4*blk)
				}
			}
			keys := indexedKeys(s)
			for i := range 10 {
				if got, want := keys[nsKey("a", i)], i >= 6; got != want {
					t.Errorf("a/%d indexed %v, want %v (the newest four stay)", i, got, want)
				}
			}
			for i := range 4 {
				if !keys[nsKey("b", i)] {
					t.Errorf("b/%d evicted for a's quota", i)
				}
			}
			q := quotaOf(t, s, "a")
			if q.Evictions != 6 || q.Refusals != 0 {
				t.Errorf("quota evictions %d refusals %d, want 6 and 0", q.Evictions, q.Refusals)
			}
			qm := m.NamespaceQuota
			for name, tc := range map[string]struct{ got, want float64 }{
				"quota_bytes":     {metrics.Value(qm.Bytes.WithLabelValues("a")), 4 * blk},
				"used_bytes":      {metrics.Value(qm.Used.WithLabelValues("a")), 4 * blk},
				"quota_evictions": {metrics.Value(qm.Evictions.WithLabelValues("a")), 6},
			} {
				if tc.got != tc.want {
					t.Errorf("pegaflow_namespace_%s{a} = %v, want %v", name, tc.got, tc.want)
				}
			}
		})
	}
}

// TestQuotaRefusalChangesNothing: a put the namespace's own blocks cannot
// make room for is ErrQuotaExceeded (and ErrNoSpace), counted, and leaves
// the index and the pool as they were.
func TestQuotaRefusalChangesNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, s *Store) // fills s; a's quota is 2 blocks
		put   uint64                       // bytes of the refused a block
	}{
		{"larger than the quota", func(t *testing.T, s *Store) {
			mustPutBlk(t, s, nsKey("a", 0))
		}, 3 * blk},
		{"own blocks pinned", func(t *testing.T, s *Store) {
			mustPutBlk(t, s, nsKey("a", 0))
			mustPutBlk(t, s, nsKey("a", 1))
			pinned, _ := s.Pin([]Key{nsKey("a", 0), nsKey("a", 1)})
			t.Cleanup(func() { s.Unpin(pinned) })
		}, blk},
		{"contiguity needs another namespace", func(t *testing.T, s *Store) {
			// Pool of 4 blocks: a0 b0 b1 b2. Two blocks of room for a
			// must take b0 with a0.
			mustPutBlk(t, s, nsKey("a", 0))
			for i := range 3 {
				mustPutBlk(t, s, nsKey("b", i))
			}
		}, 2 * blk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, m := newStore(t, 4*blk)
			setQuotas(t, s, Quota{"a", 2 * blk})
			tc.setup(t, s)
			keys, used, st := indexedKeys(s), s.Pool().Used(), quotaOf(t, s, "a")
			err := putBlk(t, s, nsKey("a", 9), tc.put)
			if !errors.Is(err, ErrQuotaExceeded) || !errors.Is(err, ErrNoSpace) {
				t.Fatalf("Put = %v, want ErrQuotaExceeded and ErrNoSpace", err)
			}
			if got := indexedKeys(s); !maps.Equal(got, keys) {
				t.Errorf("refused put changed the index: %v, was %v", got, keys)
			}
			if got := s.Pool().Used(); got != used {
				t.Errorf("refused put changed pool use: %d, was %d", got, used)
			}
			after := quotaOf(t, s, "a")
			if after.Used != st.Used || after.Evictions != st.Evictions || after.Refusals != st.Refusals+1 {
				t.Errorf("quota after refusal %+v, before %+v (want one more refusal)", after, st)
			}
			if got := metrics.Value(m.NamespaceQuota.Refusals.WithLabelValues("a")); got != 1 {
				t.Errorf("pegaflow_namespace_quota_refusals_total{a} = %v, want 1", got)
			}
		})
	}
}

// TestQuotaSetEvictsAtOnce: lowering a quota below use evicts down to it
// at once (own blocks only, oldest first); raising or dropping it evicts
// nothing; invalid quotas change nothing.
func TestQuotaSetEvictsAtOnce(t *testing.T) {
	s, m := newStore(t, 64*blk)
	for i := range 8 {
		mustPutBlk(t, s, nsKey("a", i))
		mustPutBlk(t, s, nsKey("b", i))
	}
	setQuotas(t, s, Quota{"a", 8 * blk}) // at use: nothing goes
	if q := quotaOf(t, s, "a"); q.Used != 8*blk || q.Evictions != 0 {
		t.Fatalf("quota at use: %+v, want 8 blocks used, no evictions", q)
	}
	for _, tc := range []struct {
		name   string
		qs     []Quota
		wantA  int    // a's blocks left (the newest)
		errStr string // non-empty: SetQuotas fails, nothing changes
	}{
		{"lowered", []Quota{{"a", 3 * blk}}, 3, ""},
		{"raised", []Quota{{"a", 16 * blk}}, 3, ""},
		{"empty namespace", []Quota{{"a", blk}, {"", blk}}, 3, "empty namespace"},
		{"zero size", []Quota{{"a", 0}}, 3, "0 bytes"},
		{"twice", []Quota{{"a", blk}, {"a", 2 * blk}}, 3, "twice"},
		{"lowered again", []Quota{{"a", blk}, {"b", 16 * blk}}, 1, ""},
		{"dropped", nil, 1, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := s.SetQuotas(tc.qs)
			if tc.errStr != "" {
				if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), tc.errStr) {
					t.Fatalf("SetQuotas = %v, want ErrInvalid saying %q", err, tc.errStr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			keys := indexedKeys(s)
			for i := range 8 {
				if got, want := keys[nsKey("a", i)], i >= 8-tc.wantA; got != want {
					t.Errorf("a/%d indexed %v, want %v", i, got, want)
				}
				if !keys[nsKey("b", i)] {
					t.Errorf("b/%d evicted", i)
				}
			}
		})
	}
	if len(s.Quotas()) != 0 {
		t.Errorf("quotas after dropping them all: %v", s.Quotas())
	}
	// A dropped quota's series go with it.
	if n := testutil.CollectAndCount(m.NamespaceQuota.Bytes); n != 0 {
		t.Errorf("pegaflow_namespace_quota_bytes has %d series after every quota was dropped", n)
	}
}

// TestQuotaInsertTrims: blocks inserted without a namespaced allocation
// (a prefetch's copies) are accounted too, and trim their group.
func TestQuotaInsertTrims(t *testing.T) {
	s, _ := newStore(t, 64*blk)
	setQuotas(t, s, Quota{"a", 2 * blk})
	for i := range 4 {
		e, err := s.AllocExtent(blk)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.InsertFetched(nsKey("a", i), e, []SlotLayout{{KLen: blk}}); err != nil {
			t.Fatal(err)
		}
		s.ReleaseExtent(e)
	}
	if q := quotaOf(t, s, "a"); q.Used != 2*blk || q.Evictions != 2 {
		t.Errorf("after 4 fetched inserts: %+v, want 2 blocks used, 2 evicted", q)
	}
	// Which go is the policy's (lru puts fetched copies last), but never
	// the block being inserted.
	if keys := indexedKeys(s); len(keys) != 2 || !keys[nsKey("a", 3)] {
		t.Errorf("indexed after trimming: %v, want two blocks, a/3 among them", keys)
	}
}

// TestQuotaOtherNamespaceUnchanged: namespace a filling far past its
// quota, under every policy, leaves b's blocks all hits.
func TestQuotaOtherNamespaceUnchanged(t *testing.T) {
	for _, kind := range []evict.Kind{evict.KindLRU, evict.KindPrefix, evict.KindAdaptive} {
		t.Run(string(kind), func(t *testing.T) {
			s, _ := newPolicyStoreSized(t, kind, 64*blk)
			setQuotas(t, s, Quota{"a", 16 * blk})
			var bKeys []Key
			for i := range 32 {
				bKeys = append(bKeys, nsKey("b", i))
				mustPutBlk(t, s, bKeys[i])
			}
			for i := range 500 {
				mustPutBlk(t, s, nsKey("a", i))
				if q := quotaOf(t, s, "a"); q.Used > 16*blk {
					t.Fatalf("a/%d: quota used %d > %d", i, q.Used, 16*blk)
				}
			}
			if q := quotaOf(t, s, "a"); q.Used != 16*blk {
				t.Errorf("a filled to %d bytes, want its quota %d", q.Used, 16*blk)
			}
			pinned, missing := s.Pin(bKeys)
			defer s.Unpin(pinned)
			if len(missing) != 0 {
				t.Errorf("b's hit ratio fell to %d/%d (missing %v)", len(pinned), len(bKeys), missing)
			}
		})
	}
}

// TestQuotaConcurrentPuts: puts racing past the lock-free check of the
// allocation fast path still leave the namespace within its quota once
// indexed, and never touch another namespace.
func TestQuotaConcurrentPuts(t *testing.T) {
	s, _ := newStore(t, 64*blk)
	setQuotas(t, s, Quota{"a", 16 * blk})
	var bKeys []Key
	for i := range 32 {
		bKeys = append(bKeys, nsKey("b", i))
		mustPutBlk(t, s, bKeys[i])
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for i := range 200 {
				if err := putBlk(t, s, nsKey("a", w*1000+i), blk); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	q := quotaOf(t, s, "a")
	if q.Used > 16*blk {
		t.Errorf("a holds %d bytes, over its quota %d", q.Used, 16*blk)
	}
	pinned, missing := s.Pin(bKeys)
	s.Unpin(pinned)
	if len(missing) != 0 {
		t.Errorf("b lost blocks %v", missing)
	}
	st := s.Stats()
	if st.Bytes != st.Pool.Used {
		t.Errorf("indexed %d bytes, pool has %d allocated (leak)", st.Bytes, st.Pool.Used)
	}
}

// BenchmarkPutQuota: a put's cost where the pool evicts for it (no quota,
// as BenchmarkPutUnderPressure), where a quota covers another namespace,
// and where its own quota evicts for it (the pool has room).
func BenchmarkPutQuota(b *testing.B) {
	const bs = 64 << 10
	for _, tc := range []struct {
		name string
		qs   []Quota
	}{
		{"pool evicts", nil},
		{"other quota", []Quota{{"other", 1 << 20}}},
		{"own quota evicts", []Quota{{"ns", 32 << 20}}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			s, _ := newStore(b, 64<<20)
			setQuotas(b, s, tc.qs...)
			sizes := []SlotSize{{KSize: bs / 2, VSize: bs / 2}}
			fill := func([]byte) error { return nil }
			b.SetBytes(bs)
			for i := 0; b.Loop(); i++ {
				if _, err := s.Put(key(i), sizes, fill); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
