package holder

import (
	"fmt"
	"testing"
)

// TestFirstRepeat: firstRepeat names the first hash that repeats an
// earlier one and that earlier one, as a map of the hashes seen would,
// for chains up to the request cap, repeats anywhere, and hashes that
// differ only in their last byte or length.
func TestFirstRepeat(t *testing.T) {
	chain := func(n int) [][]byte {
		hs := make([][]byte, n)
		for i := range hs {
			hs[i] = fmt.Appendf(nil, "%032x", i)
		}
		return hs
	}
	with := func(hs [][]byte, at, of int) [][]byte {
		hs[at] = append([]byte(nil), hs[of]...)
		return hs
	}
	tests := []struct {
		name   string
		hashes [][]byte
	}{
		{"one", chain(1)},
		{"two equal", with(chain(2), 1, 0)},
		{"150 distinct", chain(150)},
		{"150, last repeats first", with(chain(150), 149, 0)},
		{"150, repeat in the middle", with(chain(150), 80, 79)},
		{"cap distinct", chain(DefaultMaxHashes)},
		{"cap, two repeats", with(with(chain(DefaultMaxHashes), 4000, 7), 3000, 2999)},
		{"prefixes", [][]byte{[]byte("a"), []byte("ab"), []byte("abc"), []byte("ab")}},
		{"last byte", [][]byte{{1, 2, 3}, {1, 2, 4}, {1, 2, 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wi, wj, wdup := 0, 0, false
			seen := map[string]int{}
			for i, h := range tt.hashes {
				if j, ok := seen[string(h)]; ok {
					wi, wj, wdup = i, j, true
					break
				}
				seen[string(h)] = i
			}
			i, j, dup := firstRepeat(tt.hashes)
			if i != wi || j != wj || dup != wdup {
				t.Fatalf("firstRepeat = (%d, %d, %v), want (%d, %d, %v)", i, j, dup, wi, wj, wdup)
			}
		})
	}
}
