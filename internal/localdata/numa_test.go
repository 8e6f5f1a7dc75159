package localdata

import (
	"net"
	"reflect"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/api/localwire"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/pool"
	pegadtest "github.com/pegaflow/pegad/internal/testutil"
)

const numaPool = 8 << 20 // two parts of 4 MiB, on nodes 0 and 1

// newNUMAFixture serves a pool split over nodes 0 and 1 (pegadtest.FakeNUMA:
// this host need not have two).
func newNUMAFixture(t *testing.T) *fixture {
	t.Helper()
	return newFixtureOn(t, pool.Options{Size: numaPool, Log: zerolog.Nop(), Nodes: []int{0, 1}, Policy: &pegadtest.FakeNUMA{}},
		func(l net.Listener) net.Listener { return l })
}

func allocOnBody(node int32, hash string, k uint64) []byte {
	return localwire.AppendAllocOnItem(nil, localwire.AllocOnItem{Node: node, AllocItem: localwire.AllocItem{
		Key: localwire.Key{Namespace: "ns", Hash: []byte(hash)}, Slots: []localwire.SlotSize{{K: k}}}})
}

// partOf is the node of the part of hello's parts holding off.
func partOf(t *testing.T, parts []localwire.Part, off uint64) int32 {
	t.Helper()
	for _, p := range parts {
		if off >= p.Off && off-p.Off < p.Len {
			return p.Node
		}
	}
	t.Fatalf("offset %d in no part of %+v", off, parts)
	return 0
}

func fallbacks(f *fixture, reason string) float64 {
	return testutil.ToFloat64(f.srv.met.NUMAFallback.WithLabelValues(reason))
}

// TestHelloListsPoolParts: a version-4 HELLO tells the client the pool's
// NUMA parts.
func TestHelloListsPoolParts(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T) *fixture
		want []localwire.Part
	}{
		{"two nodes", newNUMAFixture, []localwire.Part{{Node: 0, Off: 0, Len: numaPool / 2}, {Node: 1, Off: numaPool / 2, Len: numaPool / 2}}},
		{"one part", newFixture, nil}, // node: wherever the host put it
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := tc.f(t)
			got := f.dial(t, true).hello.Parts
			if tc.want == nil {
				if len(got) != 1 || got[0].Off != 0 || got[0].Len != f.st.Pool().Size() || int(got[0].Node) != f.st.Pool().NUMA() {
					t.Fatalf("parts %+v, want one part of the whole pool on node %d", got, f.st.Pool().NUMA())
				}
				return
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("parts %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestAllocOnPlacesOnNode: ALLOC_ON's room lies on the part of the node it
// names, with no fallback counted.
func TestAllocOnPlacesOnNode(t *testing.T) {
	f := newNUMAFixture(t)
	rc := f.dial(t, true)
	for i, node := range []int32{1, 0, 1, 0} {
		_, res := rc.call(localwire.OpAllocOn, 1, allocOnBody(node, string(rune('a'+i)), 64<<10))
		if res[0].Status != localwire.StatusOK {
			t.Fatalf("alloc_on node %d: %+v", node, res[0])
		}
		if got := partOf(t, rc.hello.Parts, res[0].Seg.Off); got != node {
			t.Fatalf("alloc_on node %d placed at %d, on node %d", node, res[0].Seg.Off, got)
		}
	}
	if n := fallbacks(f, metrics.NUMAFallbackFull) + fallbacks(f, metrics.NUMAFallbackAbsent); n != 0 {
		t.Fatalf("%v fallbacks counted", n)
	}
}

// TestAllocOnFallsBack: a node whose part is full, or that the pool has no
// part on, still gets room (on another part), counted by reason.
func TestAllocOnFallsBack(t *testing.T) {
	f := newNUMAFixture(t)
	rc := f.dial(t, true)
	// Fill node 1's part with one held write lease.
	_, res := rc.call(localwire.OpAllocOn, 1, allocOnBody(1, "big", numaPool/2))
	if res[0].Status != localwire.StatusOK || partOf(t, rc.hello.Parts, res[0].Seg.Off) != 1 {
		t.Fatalf("filling node 1: %+v", res[0])
	}
	for _, tc := range []struct {
		name   string
		node   int32
		reason string
	}{
		{"part full", 1, metrics.NUMAFallbackFull},
		{"no such part", 7, metrics.NUMAFallbackAbsent},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := fallbacks(f, tc.reason)
			_, res := rc.call(localwire.OpAllocOn, 1, allocOnBody(tc.node, tc.name, 64<<10))
			if res[0].Status != localwire.StatusOK {
				t.Fatalf("alloc_on node %d: %+v", tc.node, res[0])
			}
			if got := partOf(t, rc.hello.Parts, res[0].Seg.Off); got != 0 {
				t.Fatalf("placed on node %d, want the only part with room (0)", got)
			}
			if got := fallbacks(f, tc.reason) - before; got != 1 {
				t.Fatalf("%s fallbacks counted: %v, want 1", tc.reason, got)
			}
		})
	}
}

// TestAllocOnRefusesBadNode: a node id no machine has is refused with a
// clear error, and nothing is allocated or leased; the connection goes on.
func TestAllocOnRefusesBadNode(t *testing.T) {
	f := newNUMAFixture(t)
	rc := f.dial(t, true)
	for _, node := range []int32{-2, localwire.MaxNode + 1, -1 << 31} {
		used, leases := f.st.Pool().Used(), f.srv.Leases().Len()
		_, res := rc.call(localwire.OpAllocOn, 1, allocOnBody(node, "h", 4096))
		if res[0].Status != localwire.StatusInvalid || !strings.Contains(res[0].Msg, "NUMA node") {
			t.Fatalf("alloc_on node %d: %+v, want invalid naming the NUMA node", node, res[0])
		}
		if f.st.Pool().Used() != used || f.srv.Leases().Len() != leases {
			t.Fatalf("node %d: pool used %d → %d, leases %d → %d", node, used, f.st.Pool().Used(), leases, f.srv.Leases().Len())
		}
	}
	// NoNode is no preference: ALLOC's placement, no fallback counted.
	if _, res := rc.call(localwire.OpAllocOn, 1, allocOnBody(localwire.NoNode, "h", 4096)); res[0].Status != localwire.StatusOK {
		t.Fatalf("alloc_on with no node: %+v", res[0])
	}
	if n := fallbacks(f, metrics.NUMAFallbackFull) + fallbacks(f, metrics.NUMAFallbackAbsent); n != 0 {
		t.Fatalf("%v fallbacks counted", n)
	}
}
