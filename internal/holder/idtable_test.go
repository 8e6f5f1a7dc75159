package holder

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// TestIDTableMatchesMap drives an idTable and a map with the same random
// puts and deletes and checks they agree after each step. Ids share a few
// home slots on purpose so that probe runs are long, wrap around the end
// of the table and are cut by deletions; growth and shrinking happen on
// the way.
func TestIDTableMatchesMap(t *testing.T) {
	tests := []struct {
		name  string
		homes uint64 // distinct home values ids are drawn from
		ops   int
	}{
		{"spread", 1 << 40, 20000},
		{"crowded", 5, 4000},
		{"one home", 1, 2000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(tc.ops), tc.homes))
			var tab idTable
			ref := map[sessionID]*session{}
			var ids []sessionID
			mk := func() sessionID {
				var id sessionID
				binary.LittleEndian.PutUint64(id[:8], rng.Uint64()) // unique part
				h := rng.Uint64N(tc.homes)
				if tc.homes > 8 {
					h = rng.Uint64()
				} else {
					h = h*0x9e3779b97f4a7c15 | 7 // near the top of any table: wraps
				}
				binary.LittleEndian.PutUint64(id[8:], h)
				return id
			}
			for op := range tc.ops {
				if len(ids) == 0 || rng.IntN(100) < 55-(op*30/tc.ops) {
					s := &session{id: mk()}
					tab.put(s)
					ref[s.id] = s
					ids = append(ids, s.id)
				} else {
					i := rng.IntN(len(ids))
					id := ids[i]
					ids[i] = ids[len(ids)-1]
					ids = ids[:len(ids)-1]
					if !tab.del(id) {
						t.Fatalf("op %d: del of a present id failed", op)
					}
					delete(ref, id)
					if tab.del(id) || tab.get(id) != nil {
						t.Fatalf("op %d: id still there after del", op)
					}
				}
				if tab.len() != len(ref) {
					t.Fatalf("op %d: len %d, want %d", op, tab.len(), len(ref))
				}
				if op%97 == 0 || len(ref) < 20 {
					for id, s := range ref {
						if tab.get(id) != s {
							t.Fatalf("op %d: get(%v) lost its session (len %d, table %d)", op, id, len(ref), len(tab.slots))
						}
					}
					n := 0
					tab.each(func(s *session) {
						n++
						if ref[s.id] != s {
							t.Fatalf("op %d: each visited a session not in the table", op)
						}
					})
					if n != len(ref) {
						t.Fatalf("op %d: each visited %d, want %d", op, n, len(ref))
					}
				}
			}
			if tab.get(mk()) != nil {
				t.Fatal("get of an id never put found something")
			}
			for _, id := range ids {
				tab.del(id)
			}
			if tab.len() != 0 || len(tab.slots) != idTableMin {
				t.Fatalf("emptied table: len %d, %d slots (want %d)", tab.len(), len(tab.slots), idTableMin)
			}
		})
	}
}
