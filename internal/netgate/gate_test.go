package netgate

import (
	"net/netip"
	"testing"
)

func TestGateEvictsOldestOfSourceThenOfAll(t *testing.T) {
	a := Source{ip: netip.MustParseAddr("10.0.0.1")}
	b := Source{ip: netip.MustParseAddr("10.0.0.2")}
	g := New[int](4, 2)
	e1, v, _ := g.Enter(1, a)
	if v != nil {
		t.Fatal("evicted below the limits")
	}
	g.Enter(2, a)
	// A third from a evicts a's oldest (1), not b's.
	_, v, why := g.Enter(3, a)
	if v == nil || v.Value() != 1 || why != ReasonSourceLimit {
		t.Fatalf("third from a evicted %v (%s), want 1 (source_limit)", v, why)
	}
	if g.Leave(e1) {
		t.Error("Leave of an evicted entry reported true")
	}
	e4, _, _ := g.Enter(4, b)
	g.Enter(5, b)
	// Full (4): a newcomer from a third source evicts the oldest of all (2).
	_, v, why = g.Enter(6, UIDSource(1000))
	if v == nil || v.Value() != 2 || why != ReasonTotalLimit {
		t.Fatalf("newcomer at the total limit evicted %v (%s), want 2 (total_limit)", v, why)
	}
	if !g.Leave(e4) || g.Leave(e4) {
		t.Error("Leave of a waiting entry: want true once, then false")
	}
	if n := g.Waiting(); n != 3 {
		t.Errorf("Waiting = %d, want 3", n)
	}
}

func TestSteps(t *testing.T) {
	settings := []byte{0, 0, 6, 4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100} // SETTINGS, one setting
	h2 := append([]byte(http2Preface), settings...)
	for _, tc := range []struct {
		name   string
		step   Step
		input  []byte
		doneAt int // bytes after which it is done; -1: never
	}{
		{"bytes", Bytes(8), []byte("0123456789"), 8},
		{"http2", HTTP2(), h2, len(h2)},
		{"http2 preface only", HTTP2(), []byte(http2Preface), -1},
		{"http2 empty settings", HTTP2(), append([]byte(http2Preface), 0, 0, 0, 4, 0, 0, 0, 0, 0), len(http2Preface) + 9},
		{"http1", HTTP1(), []byte("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\nrest"), 34},
		{"http1 bare lf", HTTP1(), []byte("GET / HTTP/1.0\n\n"), 16},
		{"http1 request line only", HTTP1(), []byte("GET /metrics HTTP/1.1\r\nHost: x\r\n"), -1},
	} {
		// Every split into two reads, and one byte at a time.
		for cut := 0; cut <= len(tc.input); cut++ {
			chunks := [][]byte{tc.input[:cut], tc.input[cut:]}
			if cut == len(tc.input) {
				chunks = nil
				for i := range tc.input {
					chunks = append(chunks, tc.input[i:i+1])
				}
			}
			scan, fed, doneAt := tc.step(), 0, -1
			for _, c := range chunks {
				if len(c) == 0 {
					continue
				}
				fed += len(c)
				if scan(c) {
					doneAt = fed
					break
				}
			}
			want := tc.doneAt // byte by byte: exactly there
			if len(chunks) == 2 && want >= 0 {
				// Two reads: at the end of the one that crosses it.
				if cut >= want {
					want = cut
				} else {
					want = len(tc.input)
				}
			}
			if doneAt != want {
				t.Errorf("%s, reads %d: done after %d bytes, want %d", tc.name, len(chunks), doneAt, want)
			}
		}
	}
}
