package ctl

import (
	"bytes"
	"encoding/hex"
	"strings"
	"testing"
	"time"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
)

func TestHumanBytes(t *testing.T) {
	tests := []struct {
		n    uint64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1.0 KiB"}, {1536, "1.5 KiB"},
		{1 << 20, "1.0 MiB"}, {64 << 20, "64.0 MiB"}, {3 << 30, "3.0 GiB"}, {1 << 40, "1.0 TiB"},
	}
	for _, tc := range tests {
		if got := humanBytes(tc.n); got != tc.want {
			t.Errorf("humanBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestHumanDur(t *testing.T) {
	tests := []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"}, {1234567 * time.Nanosecond, "1ms"}, {1449 * time.Millisecond, "1.4s"},
		{118500 * time.Millisecond, "1m59s"}, {-2 * time.Second, "-2s"},
	}
	for _, tc := range tests {
		if got := humanDur(tc.d); got != tc.want {
			t.Errorf("humanDur(%s) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestSlotsSummary(t *testing.T) {
	tests := []struct {
		slots []slotJSON
		want  string
	}{
		{nil, "0"},
		{[]slotJSON{{KSize: 4096}}, "1x4.0 KiB"},
		{[]slotJSON{{1024, 512}, {1024, 512}}, "2x(1.0 KiB+512 B)"},
		{[]slotJSON{{1024, 0}, {1024, 512}}, "2 (mixed)"},
	}
	for _, tc := range tests {
		if got := slotsSummary(tc.slots); got != tc.want {
			t.Errorf("slotsSummary(%v) = %q, want %q", tc.slots, got, tc.want)
		}
	}
}

// Empty answers print a header only (table) and [] lists (JSON).
func TestEmptyResults(t *testing.T) {
	results := []result{
		&listBlocksResult{Blocks: []blockJSON{}},
		sessionsOf(&pegadv1.ListSessionsResponse{}),
		connsOf(&pegadv1.ListConnsResponse{}),
		prefetchOf("h:1", "ns", &pegaclient.PrefetchResult{}),
	}
	for _, r := range results {
		var tb, jb bytes.Buffer
		if err := (tablePrinter{w: &tb}).print(r); err != nil {
			t.Fatal(err)
		}
		if err := (jsonPrinter{w: &jb}).print(r); err != nil {
			t.Fatal(err)
		}
		if lines := strings.Count(tb.String(), "\n"); lines < 1 || lines > 2 {
			t.Errorf("%T: empty table has %d lines:\n%s", r, lines, tb.String())
		}
		if strings.Contains(jb.String(), "null") || !strings.Contains(jb.String(), "[]") {
			t.Errorf("%T: empty JSON = %s", r, jb.String())
		}
		if strings.Contains(tb.String(), "FETCH") {
			t.Errorf("sessions table shows the fetch section with no fetch:\n%s", tb.String())
		}
	}
}

func FuzzParseHash(f *testing.F) {
	for _, s := range []string{"", "ab", "ABCDEF01", "abc", "zz", "0x12", strings.Repeat("ff", 64), strings.Repeat("ff", 65), "ab cd"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := parseHash(s)
		if err != nil {
			code, msg := classify(err)
			if code != ExitUsage || msg == "" {
				t.Fatalf("parseHash(%q): error %v classified as %d %q, want a usage error", s, err, code, msg)
			}
			return
		}
		if len(b) == 0 || len(b) > limits.MaxHashLen {
			t.Fatalf("parseHash(%q) accepted %d bytes", s, len(b))
		}
		if hexOf(b) != strings.ToLower(s) {
			t.Fatalf("parseHash(%q) round trip = %q", s, hexOf(b))
		}
		if _, err := hex.DecodeString(s); err != nil {
			t.Fatalf("parseHash(%q) accepted what hex rejects: %v", s, err)
		}
	})
}
