package replay

import (
	"math"
	"strings"
	"testing"
)

func trace(chains ...[]uint64) []Request {
	out := make([]Request, len(chains))
	for i, c := range chains {
		out[i] = Request{HashIDs: c}
	}
	return out
}

func TestSimulatorsSmall(t *testing.T) {
	// Accesses: 1 2 3 | 1 2 4 | 3 1 2 5 (10 in all).
	reqs := trace([]uint64{1, 2, 3}, []uint64{1, 2, 4}, []uint64{3, 1, 2, 5})
	for _, tc := range []struct {
		name        string
		capacity    int
		lru, belady uint64
	}{
		// capacity 0: nothing is kept.
		{"none", 0, 0, 0},
		// capacity 2 LRU: each block is evicted just before its reuse
		// (the classic loop larger than the cache): no hit.
		// Belady keeps 1 and 2 (reused soonest) and evicts each newcomer:
		// hits 1,2 in req 2 and again in req 3.
		{"two", 2, 0, 4},
		// capacity 3 LRU: req 2 hits 1,2 and evicts 3 for 4; in req 3 each
		// miss evicts the next block to be used: 2 hits.
		// Belady: req 2 hits 1,2 and evicts 4 (never used again) at once;
		// req 3 hits 3,1,2: 5 hits.
		{"three", 3, 2, 5},
		// Everything fits: every re-access hits (1,2 twice; 3 once).
		{"all", 5, 5, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := LRU(reqs, tc.capacity); got != (Ratio{tc.lru, 10}) {
				t.Errorf("LRU = %+v, want %d/10", got, tc.lru)
			}
			if got := Belady(reqs, tc.capacity); got != (Ratio{tc.belady, 10}) {
				t.Errorf("Belady = %+v, want %d/10", got, tc.belady)
			}
		})
	}
}

// The figures issue 25 quotes for the Mooncake synthetic trace, capacity
// as a share of its 43,924 unique blocks (rounded down), to 3 places.
func TestSimulatorsMooncakeTrace(t *testing.T) {
	reqs := loadMooncake(t)
	acc, uniq := Stats(reqs)
	if len(reqs) != 3993 || acc != 121877 || uniq != 43924 {
		t.Fatalf("trace: %d requests, %d accesses, %d unique", len(reqs), acc, uniq)
	}
	for _, tc := range []struct {
		share       float64
		lru, belady float64
	}{
		{0.02, 0.076, 0.261},
		{0.05, 0.155, 0.396},
		{0.10, 0.260, 0.506},
		{0.20, 0.391, 0.608},
	} {
		c := int(float64(uniq) * tc.share)
		if got := LRU(reqs, c).Value(); math.Abs(got-tc.lru) > 0.0005 {
			t.Errorf("LRU at %.0f%% (%d blocks) = %.4f, want %.3f", tc.share*100, c, got, tc.lru)
		}
		if got := Belady(reqs, c).Value(); math.Abs(got-tc.belady) > 0.0005 {
			t.Errorf("Belady at %.0f%% (%d blocks) = %.4f, want %.3f", tc.share*100, c, got, tc.belady)
		}
	}
}

func loadMooncake(t testing.TB) []Request {
	t.Helper()
	reqs, err := ReadTraceFile("testdata/mooncake_fast25_synthetic_trace.jsonl.gz")
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

func TestReadTraceRejects(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "no requests"},
		{"not json", "{\"hash_ids\": [1]}\nnope\n", "line 2"},
		{"unknown field", `{"hash_ids": [1], "hash": 3}`, "unknown field"},
		{"no ids", `{"timestamp": 1, "hash_ids": []}`, "no hash_ids"},
		{"negative id", `{"hash_ids": [-1]}`, "line 1"},
		{"two values", `{"hash_ids": [1]} {"hash_ids": [2]}`, "more than one"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	reqs, err := ReadTrace(strings.NewReader("\n{\"timestamp\": 5, \"input_length\": 1024, \"output_length\": 2, \"hash_ids\": [7, 8]}\n\n"))
	if err != nil || len(reqs) != 1 || reqs[0].Timestamp != 5 || len(reqs[0].HashIDs) != 2 {
		t.Fatalf("good trace: %+v, %v", reqs, err)
	}
}
