package store

import (
	"maps"
	"slices"
	"testing"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/metrics/metricstest"
	"github.com/pegaflow/pegad/internal/pool"
)

// accessLog is an LRU that records what each Access was told.
type accessLog struct {
	*evict.LRU
	chains [][]*evict.Node
	ids    [][]uint64
}

func (a *accessLog) Access(chain []*evict.Node, ids []uint64) {
	a.chains = append(a.chains, slices.Clone(chain))
	a.ids = append(a.ids, slices.Clone(ids))
	a.LRU.Access(chain, ids)
}

// TestPinChainAsPin: PinChain(ns, hashes) pins, reports and teaches the
// policy and the hints exactly what Pin of the keys {ns, hashes[i]} does,
// for chains with missing keys at the start, in runs and at the end, and
// none of it keeps the caller's hash bytes.
func TestPinChainAsPin(t *testing.T) {
	tests := []struct {
		name  string
		chain []int // key indices; those ≥ 10 are never put
	}{
		{"all found", []int{0, 1, 2, 3}},
		{"first missing", []int{10, 0, 1}},
		{"run missing", []int{0, 11, 12, 13, 1}},
		{"last missing", []int{0, 1, 14}},
		{"none found", []int{15, 16, 17}},
		{"one missing", []int{18}},
		{"one found", []int{2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			type side struct {
				s     *Store
				m     *metrics.Metrics
				log   *accessLog
				nodes map[*evict.Node]Key
			}
			mk := func() side {
				p, err := pool.New(pool.Options{Size: 1 << 20, Log: zerolog.Nop()})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = p.Close() })
				log := &accessLog{LRU: evict.NewLRU()}
				m := metricstest.New()
				s := NewWithPolicy(p, m, log)
				for i := range 4 {
					mustPut(t, s, key(i), i, SlotSize{KSize: 4 * kib})
				}
				nodes := map[*evict.Node]Key{}
				s.mu.Lock()
				for k, b := range s.index.all() {
					nodes[&b.node] = k
				}
				s.mu.Unlock()
				return side{s, m, log, nodes}
			}
			viaKeys, viaHashes := mk(), mk()
			keys := make([]Key, len(tt.chain))
			hashes := make([][]byte, len(tt.chain))
			for i, k := range tt.chain {
				keys[i] = key(k)
				hashes[i] = []byte(key(k).Hash)
			}
			p1, m1 := viaKeys.s.Pin(keys)
			p2, m2 := viaHashes.s.PinChain("ns", hashes)
			for i := range hashes { // the store must have made its own strings
				clear(hashes[i])
			}
			if !slices.Equal(m1, m2) {
				t.Fatalf("missing: Pin %v, PinChain %v", m1, m2)
			}
			k1, k2 := blockKeys(p1), blockKeys(p2)
			if !slices.Equal(k1, k2) {
				t.Fatalf("pinned: Pin %v, PinChain %v", k1, k2)
			}
			if !maps.Equal(viaKeys.s.hints, viaHashes.s.hints) {
				t.Fatalf("hints: Pin %v, PinChain %v", viaKeys.s.hints, viaHashes.s.hints)
			}
			told := func(sd side) (chains [][]Key) {
				for _, c := range sd.log.chains {
					var ks []Key
					for _, n := range c {
						ks = append(ks, sd.nodes[n]) // nil node: the zero Key
					}
					chains = append(chains, ks)
				}
				return chains
			}
			if c1, c2 := told(viaKeys), told(viaHashes); !slices.EqualFunc(c1, c2, slices.Equal[[]Key]) {
				t.Fatalf("policy chains: Pin %v, PinChain %v", c1, c2)
			}
			if !slices.EqualFunc(viaKeys.log.ids, viaHashes.log.ids, slices.Equal[[]uint64]) {
				t.Fatalf("policy ids: Pin %v, PinChain %v", viaKeys.log.ids, viaHashes.log.ids)
			}
			for i, k := range tt.chain { // ids are keyID's, found or not
				if len(viaHashes.log.ids) > 0 && viaHashes.log.ids[0][i] != keyID(key(k)) {
					t.Fatalf("id %d is not keyID(%v)", i, key(k))
				}
			}
			for _, sd := range []struct {
				m *metrics.Metrics
				p []*Block
				s *Store
			}{{viaKeys.m, p1, viaKeys.s}, {viaHashes.m, p2, viaHashes.s}} {
				if got, want := metrics.Value(sd.m.PoolPinned), float64(len(sd.p)*4*kib); got != want {
					t.Fatalf("pinned bytes %v, want %v", got, want)
				}
				sd.s.Unpin(sd.p)
				if got := metrics.Value(sd.m.PoolPinned); got != 0 {
					t.Fatalf("pinned bytes after Unpin %v, want 0", got)
				}
			}
		})
	}
}

func blockKeys(bs []*Block) []Key {
	ks := make([]Key, len(bs))
	for i, b := range bs {
		ks[i] = b.Key()
	}
	return ks
}

// TestUnpinGaugesOnce: one Unpin of several blocks, some deleted while
// pinned (their memory freed by this Unpin), leaves the pinned, deferred
// and block gauges where the store's counters are.
func TestUnpinGaugesOnce(t *testing.T) {
	s, m := newStore(t, 1<<20)
	keys := []Key{key(0), key(1), key(2), key(3)}
	for i, k := range keys {
		mustPut(t, s, k, i, SlotSize{KSize: 4 * kib})
	}
	pinned, _ := s.Pin(keys)
	for _, k := range keys[:2] {
		if deferred, err := s.Delete(k); err != nil || !deferred {
			t.Fatalf("delete %v: deferred %v, %v", k, deferred, err)
		}
	}
	if got := metrics.Value(m.PinnedDeferred); got != 2 {
		t.Fatalf("deferred gauge %v before the unpin, want 2", got)
	}
	s.Unpin(pinned)
	for _, g := range []struct {
		name string
		got  float64
		want float64
	}{
		{"pinned bytes", metrics.Value(m.PoolPinned), 0},
		{"deferred", metrics.Value(m.PinnedDeferred), 0},
		{"blocks", metrics.Value(m.Blocks), 2},
	} {
		if g.got != g.want {
			t.Errorf("%s gauge %v after the unpin, want %v", g.name, g.got, g.want)
		}
	}
}
