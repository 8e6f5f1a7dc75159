package conn

import (
	"errors"
	"testing"

	"google.golang.org/protobuf/proto"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

func TestMergeExtents(t *testing.T) {
	tests := []struct {
		in, want []Extent
	}{
		{nil, []Extent{}},
		{[]Extent{{10, 5}, {0, 10}}, []Extent{{0, 15}}},                  // touching, unsorted
		{[]Extent{{0, 10}, {5, 2}}, []Extent{{0, 10}}},                   // contained
		{[]Extent{{0, 10}, {20, 5}, {0, 0}}, []Extent{{0, 10}, {20, 5}}}, // gap; empty dropped
		{[]Extent{{20, 5}, {0, 10}, {8, 14}}, []Extent{{0, 25}}},         // chain
		{[]Extent{{100, 1}, {50, 1}, {75, 1}}, []Extent{{50, 1}, {75, 1}, {100, 1}}},
	}
	for _, tc := range tests {
		got := MergeExtents(append([]Extent(nil), tc.in...))
		if len(got) != len(tc.want) {
			t.Fatalf("MergeExtents(%v) = %v, want %v", tc.in, got, tc.want)
		}
		for i := range got {
			if got[i] != tc.want[i] {
				t.Fatalf("MergeExtents(%v) = %v, want %v", tc.in, got, tc.want)
			}
		}
	}
}

func key(base, n uint64, rkey uint32) *pegadv1.WindowKey {
	return &pegadv1.WindowKey{Base: base, Length: n, Rkey: rkey}
}

// TestNewGrantRejectsMalformed: a holder's window grant comes off the
// network; a malformed one is refused whole with ErrRemoteMemory, never
// half used.
func TestNewGrantRejectsMalformed(t *testing.T) {
	tests := []struct {
		name string
		ws   []*pegadv1.MemoryWindows
	}{
		{"duplicate nic", []*pegadv1.MemoryWindows{{Nic: 0, Keys: []*pegadv1.WindowKey{key(0, 8, 1)}}, {Nic: 0}}},
		{"nic out of range", []*pegadv1.MemoryWindows{{Nic: maxNICs}}},
		{"qp out of range", []*pegadv1.MemoryWindows{{Qp: maxQPsPerPeer}}},
		{"empty window", []*pegadv1.MemoryWindows{{Keys: []*pegadv1.WindowKey{key(0, 0, 1)}}}},
		{"wrapping window", []*pegadv1.MemoryWindows{{Keys: []*pegadv1.WindowKey{key(^uint64(0)-3, 8, 1)}}}},
		{"overlapping windows", []*pegadv1.MemoryWindows{{Keys: []*pegadv1.WindowKey{key(16, 8, 1), key(0, 17, 2)}}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if g, err := NewGrant(tc.ws, "hs"); !errors.Is(err, ErrRemoteMemory) || g != nil {
				t.Fatalf("NewGrant = %v, %v; want ErrRemoteMemory", g, err)
			}
		})
	}
	if g, err := NewGrant(nil, "hs"); g != nil || err != nil {
		t.Fatalf("no windows: %v, %v; want nil, nil (the pool rkey)", g, err)
	}
}

func TestGrantLookup(t *testing.T) {
	g, err := NewGrant([]*pegadv1.MemoryWindows{
		{Nic: 1, Qp: 1, Keys: []*pegadv1.WindowKey{key(1000, 100, 7), key(0, 100, 5), key(100, 50, 6)}},
	}, "hs")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		nic     int
		addr, n uint64
		rkey    uint32
		ok      bool
	}{
		{1, 0, 100, 5, true},
		{1, 10, 20, 5, true},
		{1, 100, 50, 6, true},
		{1, 1099, 1, 7, true},
		{1, 90, 20, 0, false}, // straddles two windows: no single key covers it
		{1, 150, 1, 0, false}, // between windows
		{1, 1099, 2, 0, false},
		{1, ^uint64(0), 2, 0, false},
		{0, 0, 10, 0, false}, // a NIC the grant does not serve
	}
	for _, tc := range tests {
		qp, rkey, ok := g.lookup(tc.nic, tc.addr, tc.n)
		if ok != tc.ok || ok && (rkey != tc.rkey || qp != 1) {
			t.Fatalf("lookup(%d, %d, %d) = qp %d rkey %d %v; want rkey %d %v", tc.nic, tc.addr, tc.n, qp, rkey, ok, tc.rkey, tc.ok)
		}
	}
}

// FuzzNewGrant: any grant bytes either parse into windows that lookup
// answers consistently (a found key's window holds the range) or are
// refused; never a panic.
func FuzzNewGrant(f *testing.F) {
	seed := &pegadv1.QueryBlocksForTransferResponse{Windows: []*pegadv1.MemoryWindows{
		{Nic: 0, Qp: 1, Keys: []*pegadv1.WindowKey{key(0, 100, 5), key(100, 50, 6)}}}}
	b, _ := proto.Marshal(seed)
	f.Add(b, uint64(10), uint64(20))
	f.Fuzz(func(t *testing.T, data []byte, addr, n uint64) {
		var resp pegadv1.QueryBlocksForTransferResponse
		if proto.Unmarshal(data, &resp) != nil {
			return
		}
		g, err := NewGrant(resp.GetWindows(), resp.GetWindowsHandshakeId())
		if err != nil || g == nil {
			return
		}
		for nic, gn := range g.nics {
			if _, _, ok := g.lookup(nic, addr, n); !ok {
				continue
			}
			covered := false
			for _, k := range gn.keys {
				if addr >= k.GetBase() && addr+n >= addr && addr+n <= k.GetBase()+k.GetLength() {
					covered = true
				}
			}
			if !covered {
				t.Fatalf("lookup(%d, %d, %d) found a key no window covers", nic, addr, n)
			}
		}
	})
}
