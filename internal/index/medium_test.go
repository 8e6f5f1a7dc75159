package index_test

import (
	"fmt"
	"testing"

	"github.com/pegaflow/pegad/internal/index"
)

func TestPreferDRAM(t *testing.T) {
	d := func(id string) index.Holder { return index.Holder{NodeID: id, Medium: index.MediumDRAM} }
	s := func(id string) index.Holder { return index.Holder{NodeID: id, Medium: index.MediumSSD} }
	old := index.Holder{NodeID: "old"} // an entry without a medium: DRAM
	for _, tc := range []struct {
		in   []index.Holder
		want string
	}{
		{nil, "[]"},
		{[]index.Holder{s("a"), d("b"), s("c")}, "[b]"},
		{[]index.Holder{s("a"), s("c")}, "[a c]"},
		{[]index.Holder{d("a"), s("b"), d("c")}, "[a c]"},
		{[]index.Holder{s("a"), old}, "[old]"},
		{[]index.Holder{d("a"), d("b")}, "[a b]"},
	} {
		var ids []string
		for _, h := range index.PreferDRAM(tc.in) {
			ids = append(ids, h.NodeID)
		}
		if got := fmt.Sprint(ids); got != tc.want {
			t.Errorf("PreferDRAM(%v) = %s, want %s", tc.in, got, tc.want)
		}
	}
}
