package localdata

import (
	"testing"

	"github.com/pegaflow/pegad/api/localwire"
	"github.com/pegaflow/pegad/internal/index"
)

func TestBestHolder(t *testing.T) {
	a := index.Holder{NodeID: "a", Addr: "a:1", Incarnation: "1"}
	b := index.Holder{NodeID: "b", Addr: "b:1", Incarnation: "1"}
	bNew := index.Holder{NodeID: "b", Addr: "b:1", Incarnation: "2"}
	bSSD := index.Holder{NodeID: "b", Addr: "b:1", Incarnation: "1", Medium: index.MediumSSD}
	self := index.Holder{NodeID: "self", Addr: "s:1", Incarnation: "1"}
	tests := []struct {
		name string
		in   [][]index.Holder
		want localwire.ClusterHit
	}{
		{"empty chain", nil, localwire.ClusterHit{}},
		{"nobody has the first", [][]index.Holder{{}, {a}}, localwire.ClusterHit{}},
		{"only self", [][]index.Holder{{self}, {self}}, localwire.ClusterHit{}},
		{"longest wins", [][]index.Holder{{a, b}, {a, b}, {b}, {a}}, localwire.ClusterHit{N: 3, PeerID: "b", PeerAddr: "b:1"}},
		{"tie: first listed", [][]index.Holder{{b, a}, {a, b}}, localwire.ClusterHit{N: 2, PeerID: "b", PeerAddr: "b:1"}},
		{"other incarnation breaks the run", [][]index.Holder{{b, a}, {bNew, a}}, localwire.ClusterHit{N: 2, PeerID: "a", PeerAddr: "a:1"}},
		{"tie: a DRAM copy over an SSD one", [][]index.Holder{{bSSD, a}, {b, a}}, localwire.ClusterHit{N: 2, PeerID: "a", PeerAddr: "a:1"}},
		{"longest wins over DRAM", [][]index.Holder{{bSSD, a}, {b}}, localwire.ClusterHit{N: 2, PeerID: "b", PeerAddr: "b:1"}},
		{"self skipped", [][]index.Holder{{self, a}, {self, a}, {self}}, localwire.ClusterHit{N: 2, PeerID: "a", PeerAddr: "a:1"}},
	}
	for _, tc := range tests {
		if got := bestHolder(tc.in, "self"); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}
