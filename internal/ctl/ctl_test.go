package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	durpb "google.golang.org/protobuf/types/known/durationpb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

func TestMain(m *testing.M) {
	if a, ok := os.LookupEnv(childArgsEnv); ok {
		// Re-executed as pegactl (TestSocketPermissionDenied runs it as
		// another user).
		os.Exit(Main(context.Background(), strings.Split(a, "\x1f"), Streams{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}))
	}
	goleak.VerifyTestMain(m)
}

// writeRandom writes n random bytes to a new file in dir.
func writeRandom(t *testing.T, dir, name string, n int, seed uint64) (string, []byte) {
	t.Helper()
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return p, b
}

// wantError checks the failure contract: the exit code, nothing on stdout
// (unless allowed), and exactly one "Error: " line on stderr.
func wantError(t *testing.T, r ran, code int, contains string) {
	t.Helper()
	if r.code != code {
		t.Errorf("exit code = %d, want %d (stderr %q)", r.code, code, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "Error: ") || !strings.HasSuffix(r.stderr, "\n") || strings.Count(r.stderr, "\n") != 1 {
		t.Errorf("stderr = %q, want exactly one line \"Error: ...\"", r.stderr)
	}
	if !strings.Contains(r.stderr, contains) {
		t.Errorf("stderr = %q, want it to contain %q", r.stderr, contains)
	}
}

func decodeJSON(t *testing.T, s string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("output is not the documented JSON shape: %v\n%s", err, s)
	}
}

func TestBlocksPutGetRoundTrip(t *testing.T) {
	const mib = 1 << 20
	tests := []struct {
		name      string
		sizes     []int
		kv        bool
		wantSlots []slotJSON
	}{
		{"one multi-MiB K segment", []int{3*mib + 12345}, false, []slotJSON{{KSize: 3*mib + 12345}}},
		{"three K segments", []int{mib, 1, 2*mib - 1}, false, []slotJSON{{KSize: mib}, {KSize: 1}, {KSize: 2*mib - 1}}},
		{"two K/V slots", []int{mib + 7, 100, 4096, 2 * mib}, true, []slotJSON{{KSize: mib + 7, VSize: 100}, {KSize: 4096, VSize: 2 * mib}}},
		{"exactly one chunk", []int{mib}, false, []slotJSON{{KSize: mib}}},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := startFake(t)
			dir := t.TempDir()
			args := []string{"-o", "json", "blocks", "put", "--namespace", "ns1", "--hash", "ABCDEF01"}
			var want []byte
			for j, n := range tc.sizes {
				p, b := writeRandom(t, dir, "seg"+string(rune('a'+j)), n, uint64(i*10+j))
				want = append(want, b...)
				args = append(args, "--file", p)
			}
			if tc.kv {
				args = append(args, "--kv")
			}
			r := run(t, f, args...)
			if r.code != 0 {
				t.Fatalf("put: code %d stderr %q", r.code, r.stderr)
			}
			var put putResult
			decodeJSON(t, r.stdout, &put)
			if put.Hash != "abcdef01" || put.Namespace != "ns1" || !put.Created || put.Bytes != uint64(len(want)) {
				t.Errorf("put result = %+v", put)
			}
			if len(put.Slots) != len(tc.wantSlots) {
				t.Fatalf("slots = %+v, want %+v", put.Slots, tc.wantSlots)
			}
			for j := range put.Slots {
				if put.Slots[j] != tc.wantSlots[j] {
					t.Errorf("slot %d = %+v, want %+v", j, put.Slots[j], tc.wantSlots[j])
				}
			}

			b := f.block("ns1", []byte{0xab, 0xcd, 0xef, 0x01})
			if b == nil || !bytes.Equal(b.data, want) {
				t.Fatalf("fake server did not reassemble the block byte-identical")
			}
			f.mu.Lock()
			chunks, maxChunk := f.putChunks, f.maxChunk
			f.mu.Unlock()
			if maxChunk > 1<<20 { // the local API's limit, not our constant
				t.Errorf("largest data message %d bytes, want <= 1 MiB", maxChunk)
			}
			minChunks := (len(want) + (1 << 20) - 1) / (1 << 20)
			if chunks < minChunks {
				t.Errorf("%d data messages, want >= %d", chunks, minChunks)
			}

			out := filepath.Join(dir, "out.bin")
			r = run(t, f, "-o", "json", "blocks", "get", "--namespace", "ns1", "--hash", "abcdef01", "--out", out)
			if r.code != 0 {
				t.Fatalf("get: code %d stderr %q", r.code, r.stderr)
			}
			var get getResult
			decodeJSON(t, r.stdout, &get)
			if get.Bytes != uint64(len(want)) || get.Out != out || len(get.Slots) != len(tc.wantSlots) {
				t.Errorf("get result = %+v", get)
			}
			got, err := os.ReadFile(out)
			if err != nil || !bytes.Equal(got, want) {
				t.Fatalf("get --out file differs from the put files (err %v, %d vs %d bytes)", err, len(got), len(want))
			}

			r = run(t, f, "blocks", "get", "--namespace", "ns1", "--hash", "abcdef01", "--out", "-")
			if r.code != 0 || r.stdout != string(want) {
				t.Fatalf("get --out -: code %d, %d bytes on stdout, want %d", r.code, len(r.stdout), len(want))
			}

			// A second put of the same block keeps the stored copy.
			r = run(t, f, args[2:]...) // the same put, without -o json
			if r.code != 0 || !strings.Contains(r.stdout, "already present") {
				t.Errorf("second put: code %d stdout %q stderr %q", r.code, r.stdout, r.stderr)
			}
		})
	}
}

func TestBlocksPutUsageErrors(t *testing.T) {
	f := startFake(t)
	dir := t.TempDir()
	k, _ := writeRandom(t, dir, "k", 10, 1)
	v, _ := writeRandom(t, dir, "v", 10, 2)
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		args []string
		msg  string
	}{
		{"odd file count with --kv", []string{"--namespace", "n", "--hash", "ab", "--file", k, "--file", v, "--file", k, "--kv"}, "--kv needs pairs of --file (K then V per slot), got 3 files"},
		{"one file with --kv", []string{"--namespace", "n", "--hash", "ab", "--file", k, "--kv"}, "got 1 files"},
		{"no file", []string{"--namespace", "n", "--hash", "ab"}, "at least one --file is required"},
		{"no namespace", []string{"--hash", "ab", "--file", k}, "--namespace is required"},
		{"no hash", []string{"--namespace", "n", "--file", k}, "--hash is required"},
		{"non-hex hash", []string{"--namespace", "n", "--hash", "xyz1", "--file", k}, `invalid block hash "xyz1": not hex`},
		{"odd-length hash", []string{"--namespace", "n", "--hash", "abc", "--file", k}, `invalid block hash "abc": not hex`},
		{"hash too long", []string{"--namespace", "n", "--hash", strings.Repeat("ab", 65), "--file", k}, "hash is 65 bytes, more than 64"},
		{"missing file", []string{"--namespace", "n", "--hash", "ab", "--file", filepath.Join(dir, "nope")}, "no such file or directory"},
		{"empty file", []string{"--namespace", "n", "--hash", "ab", "--file", empty}, "empty (a segment needs at least one byte)"},
		{"directory as file", []string{"--namespace", "n", "--hash", "ab", "--file", dir}, "not a regular file"},
		{"unknown flag", []string{"--namespace", "n", "--hash", "ab", "--file", k, "--bogus"}, "unknown flag: --bogus"},
		{"positional argument", []string{"--namespace", "n", "--hash", "ab", "--file", k, "extra"}, `unknown command "extra"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, f, append([]string{"blocks", "put"}, tc.args...)...)
			wantError(t, r, ExitUsage, tc.msg)
			if r.stdout != "" {
				t.Errorf("stdout = %q, want nothing", r.stdout)
			}
		})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.putCalls != 0 {
		t.Errorf("usage errors reached the daemon: %d PutBlock calls", f.putCalls)
	}
}

func TestBlocksGetErrors(t *testing.T) {
	f := startFake(t)
	dir := t.TempDir()
	k, _ := writeRandom(t, dir, "k", 3<<20, 3)
	if r := run(t, f, "blocks", "put", "--namespace", "x", "--hash", "ab", "--file", k); r.code != 0 {
		t.Fatalf("put: %+v", r)
	}
	out := filepath.Join(dir, "out")

	r := run(t, f, "blocks", "get", "--namespace", "x", "--hash", "cd", "--out", out)
	wantError(t, r, ExitNotFound, "")
	if r.stderr != "Error: block not found: namespace=x hash=cd\n" {
		t.Errorf("stderr = %q, want the daemon's message unwrapped", r.stderr)
	}

	f.mu.Lock()
	f.getTruncate = 100
	f.mu.Unlock()
	r = run(t, f, "blocks", "get", "--namespace", "x", "--hash", "ab", "--out", out)
	wantError(t, r, ExitError, "block truncated: got 3145628 of 3145728 bytes")

	r = run(t, f, "blocks", "get", "--namespace", "x", "--hash", "ab")
	wantError(t, r, ExitUsage, "--out is required")

	// No failed get leaves a file, final or temporary, behind.
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Name() != "k" {
			t.Errorf("failed get left %s behind", e.Name())
		}
	}
}

func TestBlocksListAndDelete(t *testing.T) {
	f := startFake(t)
	r := run(t, f, "-o", "json", "blocks", "list", "--namespace", "ns", "--limit", "1")
	if r.code != 0 {
		t.Fatalf("list: %+v", r)
	}
	var list listBlocksResult
	decodeJSON(t, r.stdout, &list)
	want := blockJSON{
		Namespace: "ns", Hash: "abcd", Bytes: 3072, Slots: []slotJSON{{1024, 512}, {1024, 512}}, Pins: 2, NumaNode: 1,
		CreatedAt: "2026-12-02T15:00:00Z", LastAccess: "2026-12-02T15:01:00Z",
	}
	if len(list.Blocks) != 1 || !list.Truncated {
		t.Fatalf("list = %+v", list)
	}
	got := list.Blocks[0]
	if got.Namespace != want.Namespace || got.Hash != want.Hash || got.Bytes != want.Bytes || got.Pins != want.Pins ||
		got.NumaNode != want.NumaNode || got.CreatedAt != want.CreatedAt || got.LastAccess != want.LastAccess ||
		len(got.Slots) != 2 || got.Slots[1] != want.Slots[1] {
		t.Errorf("block = %+v, want %+v", got, want)
	}

	r = run(t, f, "blocks", "list")
	if r.code != 0 || !strings.Contains(r.stdout, "NAMESPACE") || !strings.Contains(r.stdout, "2x(1.0 KiB+512 B)") {
		t.Errorf("list table = %q", r.stdout)
	}
	if r := run(t, f, "blocks", "list", "--limit", "-1"); r.code != ExitUsage {
		t.Errorf("--limit -1: %+v", r)
	}

	dir := t.TempDir()
	k, _ := writeRandom(t, dir, "k", 10, 4)
	run(t, f, "blocks", "put", "--namespace", "x", "--hash", "01", "--file", k)
	r = run(t, f, "-o", "json", "blocks", "delete", "--namespace", "x", "--hash", "01")
	var del deleteResult
	decodeJSON(t, r.stdout, &del)
	if r.code != 0 || del != (deleteResult{Namespace: "x", Hash: "01", Deleted: true, Deferred: true}) {
		t.Errorf("delete: %+v %+v", r, del)
	}
	wantError(t, run(t, f, "blocks", "delete", "--namespace", "x", "--hash", "01"), ExitNotFound, "block not found")
}

func TestSessionsList(t *testing.T) {
	f := startFake(t)
	r := run(t, f, "sessions", "list", "-o", "json")
	if r.code != 0 {
		t.Fatalf("%+v", r)
	}
	var res sessionsResult
	decodeJSON(t, r.stdout, &res)
	wantS := sessionJSON{
		SessionID: "00112233445566778899aabbccddeeff", RequesterID: "node-b", RequesterIncarnation: "inc-1",
		Blocks: 3, Bytes: 3 << 20, CreatedAt: "2026-12-02T15:00:00Z", AgeSeconds: 1.5, ExpiresInSeconds: 118.5, Renewals: 1,
	}
	wantF := fetchJSON{ReqID: "req-7", Peer: "10.0.0.2:50055", SessionID: "ffee", Blocks: 2, Bytes: 4096, AgeSeconds: 0.25, Phase: "reading"}
	if len(res.Sessions) != 1 || res.Sessions[0] != wantS || len(res.Fetches) != 1 || res.Fetches[0] != wantF {
		t.Errorf("sessions = %+v", res)
	}

	// Raw keys: the documented snake_case names.
	var raw map[string][]map[string]any
	if err := json.Unmarshal([]byte(r.stdout), &raw); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"session_id", "requester_id", "blocks", "age_seconds", "expires_in_seconds"} {
		if _, ok := raw["sessions"][0][k]; !ok {
			t.Errorf("session JSON lacks %q: %v", k, raw["sessions"][0])
		}
	}

	r = run(t, f, "sessions", "list")
	for _, s := range []string{"SESSION", "EXPIRES IN", "00112233445566778899aabbccddeeff", "node-b", "1.5s", "1m59s", "FETCH", "req-7", "reading"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("table lacks %q:\n%s", s, r.stdout)
		}
	}

	// Empty lists are [] in JSON, never null.
	f.mu.Lock()
	f.sessions = &pegadv1.ListSessionsResponse{}
	f.mu.Unlock()
	r = run(t, f, "sessions", "list", "-o", "json")
	if !strings.Contains(r.stdout, `"sessions": []`) || !strings.Contains(r.stdout, `"fetches": []`) ||
		!strings.Contains(r.stdout, `"handoffs": []`) {
		t.Errorf("empty sessions JSON = %s", r.stdout)
	}
}

// TestSessionsListHandoffs: P/D pulls show their handoff id, and the
// handoffs pending here their blocks, age and ttl left.
func TestSessionsListHandoffs(t *testing.T) {
	f := startFake(t)
	f.mu.Lock()
	f.sessions = &pegadv1.ListSessionsResponse{
		Sessions: []*pegadv1.HolderSession{{SessionId: "00112233445566778899aabbccddeeff", RequesterId: "decode-1",
			Blocks: 2, HandoffId: "0123456789abcdef"}},
		Fetches: []*pegadv1.Fetch{{ReqId: "req-9", Peer: "10.0.0.3:50055", HandoffId: "fedcba9876543210"}},
		Handoffs: []*pegadv1.PendingHandoff{{Id: "0123456789abcdef", Namespace: "llama", Blocks: 1, BlocksTotal: 2,
			Bytes: 4 << 20, Age: durpb.New(1500 * time.Millisecond), TtlLeft: durpb.New(28500 * time.Millisecond)}},
	}
	f.mu.Unlock()
	r := run(t, f, "sessions", "list", "-o", "json")
	var res sessionsResult
	decodeJSON(t, r.stdout, &res)
	wantH := handoffJSON{ID: "0123456789abcdef", Namespace: "llama", Blocks: 1, BlocksTotal: 2, Bytes: 4 << 20,
		AgeSeconds: 1.5, TTLLeftSeconds: 28.5}
	if r.code != 0 || res.Sessions[0].HandoffID != "0123456789abcdef" || res.Fetches[0].HandoffID != "fedcba9876543210" ||
		len(res.Handoffs) != 1 || res.Handoffs[0] != wantH {
		t.Fatalf("sessions list = %+v (%+v)", res, r)
	}
	r = run(t, f, "sessions", "list")
	for _, s := range []string{"HANDOFF", "0123456789abcdef", "fedcba9876543210", "llama", "1 of 2", "28.5s"} {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("table lacks %q:\n%s", s, r.stdout)
		}
	}
}

func TestLocksRelease(t *testing.T) {
	f := startFake(t)
	r := run(t, f, "-o", "json", "locks", "release", "00112233445566778899aabbccddeeff")
	if r.code != 0 {
		t.Fatalf("%+v", r)
	}
	var res releaseResult
	decodeJSON(t, r.stdout, &res)
	if res.ReleasedBlocks != 3 || res.SessionID != "00112233445566778899aabbccddeeff" {
		t.Errorf("release = %+v", res)
	}
	f.mu.Lock()
	op := f.lastRelease.GetOperator()
	f.mu.Unlock()
	if !regexp.MustCompile(`^[^@\s]+@[^@\s]+$`).MatchString(op) || op != res.Operator {
		t.Errorf("operator sent = %q (printed %q), want user@host", op, res.Operator)
	}

	wantError(t, run(t, f, "locks", "release", "deadbeef"), ExitNotFound, "session not found: deadbeef")
	wantError(t, run(t, f, "locks", "release"), ExitUsage, "takes exactly one SESSION_ID, got 0")
	wantError(t, run(t, f, "locks", "release", "a", "b"), ExitUsage, "got 2")
}

func TestConnsList(t *testing.T) {
	f := startFake(t)
	r := run(t, f, "conns", "list", "-o", "json")
	var res connsResult
	decodeJSON(t, r.stdout, &res)
	if r.code != 0 || len(res.Conns) != 1 {
		t.Fatalf("%+v %+v", r, res)
	}
	c := res.Conns[0]
	if c.Peer != "127.0.0.1:50056" || c.State != "connected" || c.QPs != 4 || c.AgeSeconds != 90 || len(c.NICs) != 2 ||
		c.NICs[1].NIC != "tcp1" || c.NICs[1].QPs != 2 || len(c.NICs[1].LocalQPNs) != 2 || c.NICs[1].LocalQPNs[0] != 200 {
		t.Errorf("conn = %+v", c)
	}
	r = run(t, f, "conns", "list")
	if !strings.Contains(r.stdout, "tcp0:2,tcp1:2") || !strings.Contains(r.stdout, "connected") {
		t.Errorf("conns table = %q", r.stdout)
	}
}

func TestStatsAndVersion(t *testing.T) {
	f := startFake(t)
	r := run(t, f, "stats", "-o", "json")
	var st statsResult
	decodeJSON(t, r.stdout, &st)
	if r.code != 0 || st.PoolUsed != 16<<20 || st.PoolSize != 64<<20 || st.LockTimeouts != 2 || st.UptimeSeconds != 180.5 ||
		st.NodeID != "node-a" || !st.PoolLocked || st.FetchBytes != 1<<30 || st.Lookups != 4 || st.LookupHits != 30 ||
		st.Recomputed != 6 || st.Ceiling != 0.9 ||
		len(st.Quotas) != 1 || st.Quotas[0] != (quotaRow{Prefix: "llama-70b", Limit: 8 << 30, Used: 2 << 30, Blocks: 512, Evictions: 3, Refusals: 1}) {
		t.Errorf("stats = %+v (%+v)", st, r)
	}
	r = run(t, f, "stats")
	if !strings.Contains(r.stdout, "16.0 MiB (25.0%)") || !strings.Contains(r.stdout, "LOCK TIMEOUTS") ||
		!strings.Contains(r.stdout, "LOOKUP HIT RATIO  75.0% (30 of 40 blocks)") ||
		!strings.Contains(r.stdout, "HIT CEILING       90.0% (6 recomputed blocks)") ||
		!strings.Contains(r.stdout, "QUOTA llama-70b   2.0 GiB of 8.0 GiB (25.0%), 512 blocks, 3 evicted for it, 1 refused") {
		t.Errorf("stats table = %q", r.stdout)
	}

	r = run(t, f, "version", "-o", "json")
	var v versionResult
	decodeJSON(t, r.stdout, &v)
	if r.code != 0 || v.Server == nil || v.Server.Version != "v0.1.0" || v.Server.Transport != "tcp" || v.Client.GoVersion == "" {
		t.Errorf("version = %+v", v)
	}
}

func TestPrefetch(t *testing.T) {
	f := startFake(t)
	ok := &pegadv1.PrefetchResponse{
		Blocks: []*pegadv1.PrefetchBlockResult{
			{Hash: []byte{0xaa}, Status: pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED},
			{Hash: []byte{0xbb}, Status: pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_ALREADY_LOCAL},
		},
		Bytes: 8 << 20, Duration: durpb.New(1250 * time.Millisecond), SessionId: "s1",
	}
	f.mu.Lock()
	f.prefetchRes = ok
	f.mu.Unlock()
	r := run(t, f, "--timeout", "7s", "-o", "json", "prefetch", "--peer", "127.0.0.1:50055", "--namespace", "ns", "aa", "BB")
	if r.code != 0 {
		t.Fatalf("%+v", r)
	}
	var res prefetchResult
	decodeJSON(t, r.stdout, &res)
	if res.Peer != "127.0.0.1:50055" || res.SessionID != "s1" || res.DurationSeconds != 1.25 || res.Bytes != 8<<20 ||
		len(res.Blocks) != 2 || res.Blocks[0] != (prefetchBlockJSON{Hash: "aa", Status: "fetched"}) || res.Blocks[1].Status != "already_local" {
		t.Errorf("prefetch = %+v", res)
	}
	f.mu.Lock()
	req := f.lastPrefetch
	f.mu.Unlock()
	if req.GetPeer() != "127.0.0.1:50055" || req.GetNamespace() != "ns" || len(req.GetHashes()) != 2 ||
		!bytes.Equal(req.GetHashes()[1], []byte{0xbb}) || req.GetTimeout().AsDuration() != 7*time.Second {
		t.Errorf("request = %v", req)
	}

	partial := []struct {
		name   string
		status pegadv1.PrefetchBlockStatus
		code   int
		msg    string
	}{
		{"missing", pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_MISSING_ON_PEER, ExitNotFound, "1 of 2 blocks not fetched from 127.0.0.1:50055 (1 missing_on_peer)"},
		{"failed", pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED, ExitError, "(1 failed)"},
		{"discarded", pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_DISCARDED, ExitError, "(1 discarded)"},
		{"not fetched", pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_NOT_FETCHED, ExitError, "(1 not_fetched)"},
	}
	for _, tc := range partial {
		t.Run(tc.name, func(t *testing.T) {
			f.mu.Lock()
			f.prefetchRes = &pegadv1.PrefetchResponse{Blocks: []*pegadv1.PrefetchBlockResult{
				{Hash: []byte{0xaa}, Status: pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED},
				{Hash: []byte{0xbb}, Status: tc.status, Error: "boom"},
			}}
			f.mu.Unlock()
			r := run(t, f, "prefetch", "--peer", "127.0.0.1:50055", "--namespace", "ns", "aa", "bb")
			wantError(t, r, tc.code, tc.msg)
			if !strings.Contains(r.stdout, "boom") {
				t.Errorf("per-block results not printed: %q", r.stdout)
			}
		})
	}

	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{[]string{"--peer", "nohost", "--namespace", "ns", "aa"}, `invalid --peer "nohost"`},
		{[]string{"--peer", "h:1", "aa"}, "--namespace is required"},
		{[]string{"--peer", "h:1", "--namespace", "ns"}, "needs at least one block hash"},
		{[]string{"--peer", "h:1", "--namespace", "ns", "aa", "g0"}, `invalid block hash "g0"`},
	} {
		wantError(t, run(t, f, append([]string{"prefetch"}, tc.args...)...), ExitUsage, tc.msg)
	}

	f.mu.Lock()
	f.errs["Prefetch"] = status.Error(codes.Unavailable, "connection to 127.0.0.1:50055 broken")
	f.mu.Unlock()
	wantError(t, run(t, f, "prefetch", "--peer", "127.0.0.1:50055", "--namespace", "ns", "aa"), ExitUnavailable,
		"Error: connection to 127.0.0.1:50055 broken")

	// A failed fetch carries its per-block results as a status detail:
	// they are printed before the error line.
	st, serr := status.New(codes.Aborted, "lock lapsed during the read; fetched data discarded").WithDetails(
		&pegadv1.PrefetchResponse{Blocks: []*pegadv1.PrefetchBlockResult{
			{Hash: []byte{0xaa}, Status: pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_DISCARDED, Error: "lapsed"},
		}})
	if serr != nil {
		t.Fatal(serr)
	}
	f.mu.Lock()
	f.errs["Prefetch"] = st.Err()
	f.mu.Unlock()
	failed := run(t, f, "-o", "json", "prefetch", "--peer", "127.0.0.1:50055", "--namespace", "ns", "aa")
	if failed.code != ExitError || failed.stderr != "Error: lock lapsed during the read; fetched data discarded\n" {
		t.Errorf("failed prefetch: exit %d, stderr %q", failed.code, failed.stderr)
	}
	var failedRes prefetchResult
	decodeJSON(t, failed.stdout, &failedRes)
	if len(failedRes.Blocks) != 1 || failedRes.Blocks[0].Status != "discarded" || failedRes.Blocks[0].Hash != "aa" {
		t.Errorf("failed prefetch printed %+v, want the discarded block", failedRes)
	}
}

func TestErrorMapping(t *testing.T) {
	f := startFake(t)
	tests := []struct {
		err  error
		code int
		line string
	}{
		{status.Error(codes.InvalidArgument, "namespace too long"), ExitUsage, "Error: namespace too long\n"},
		{status.Error(codes.ResourceExhausted, "pool full: need 8 MiB"), ExitError, "Error: pool full: need 8 MiB\n"},
		{status.Error(codes.NotFound, "no such thing"), ExitNotFound, "Error: no such thing\n"},
		{status.Error(codes.Internal, "multi\nline\n"), ExitError, "Error: multi line\n"},
	}
	for _, tc := range tests {
		f.mu.Lock()
		f.errs["Stats"] = tc.err
		f.mu.Unlock()
		r := run(t, f, "stats")
		if r.code != tc.code || r.stderr != tc.line || r.stdout != "" {
			t.Errorf("%v: got code %d stderr %q stdout %q, want %d %q", tc.err, r.code, r.stderr, r.stdout, tc.code, tc.line)
		}
	}

	f.mu.Lock()
	delete(f.errs, "Stats")
	f.delay = 5 * time.Second
	f.mu.Unlock()
	start := time.Now()
	wantError(t, run(t, f, "--timeout", "200ms", "stats"), ExitError, "timed out")
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("--timeout 200ms took %s", el)
	}
}

func TestUsage(t *testing.T) {
	tests := []struct {
		args []string
		msg  string
	}{
		{[]string{"nope"}, `unknown command "nope" for "pegactl"`},
		{[]string{"blocks", "nope"}, `unknown command "nope" for "pegactl blocks"`},
		{[]string{"-o", "yaml", "stats"}, `invalid --output "yaml": want table or json`},
		{[]string{"--timeout", "0s", "stats"}, "invalid --timeout"},
		{[]string{"--timeout", "soon", "stats"}, "invalid argument"},
		{[]string{"stats", "extra"}, `unknown command "extra"`},
	}
	for _, tc := range tests {
		wantError(t, run(t, nil, tc.args...), ExitUsage, tc.msg)
	}
	// Help is not an error.
	if r := run(t, nil, "--help"); r.code != 0 || !strings.Contains(r.stdout, "Exit codes") {
		t.Errorf("--help: %+v", r)
	}
}

func TestDaemonNotRunning(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "absent.sock")
	for _, args := range [][]string{{"stats"}, {"sessions", "list"}, {"blocks", "get", "--namespace", "n", "--hash", "ab", "--out", "-"}} {
		r := run(t, nil, append([]string{"--socket", sock}, args...)...)
		wantError(t, r, ExitUnavailable, "cannot reach pegad at "+sock+": connect: no such file or directory (is pegad running? set --socket or PEGACTL_SOCKET)")
	}

	// version still prints the client's side.
	r := run(t, nil, "--socket", sock, "-o", "json", "version")
	var v versionResult
	decodeJSON(t, r.stdout, &v)
	if r.code != ExitUnavailable || v.Server != nil || v.Client.Version == "" {
		t.Errorf("version without daemon: %+v %+v", r, v)
	}
}

func TestSocketFromEnv(t *testing.T) {
	f := startFake(t)
	t.Setenv(EnvSocket, f.socket)
	if r := run(t, nil, "stats"); r.code != 0 {
		t.Errorf("PEGACTL_SOCKET not used: %+v", r)
	}
	// --socket wins over the environment.
	r := run(t, nil, "--socket", filepath.Join(t.TempDir(), "x.sock"), "stats")
	if r.code != ExitUnavailable {
		t.Errorf("--socket did not override PEGACTL_SOCKET: %+v", r)
	}
}

// A put the daemon refuses mid-stream reports the daemon's status, not the
// EOF the client's next Send sees.
func TestBlocksPutRefused(t *testing.T) {
	f := startFake(t)
	dir := t.TempDir()
	k, _ := writeRandom(t, dir, "k", 8<<20, 9)
	tests := []struct {
		err  error
		code int
		line string
	}{
		{status.Error(codes.ResourceExhausted, "no space: block needs 8.0 MiB, pool has 2.0 MiB free"), ExitError,
			"Error: no space: block needs 8.0 MiB, pool has 2.0 MiB free\n"},
		{status.Error(codes.InvalidArgument, "namespace longer than 256 bytes"), ExitUsage,
			"Error: namespace longer than 256 bytes\n"},
	}
	for _, tc := range tests {
		f.mu.Lock()
		f.errs["PutBlock"] = tc.err
		f.mu.Unlock()
		r := run(t, f, "blocks", "put", "--namespace", "n", "--hash", "ab", "--file", k)
		if r.code != tc.code || r.stderr != tc.line || r.stdout != "" {
			t.Errorf("got code %d stderr %q stdout %q, want %d %q", r.code, r.stderr, r.stdout, tc.code, tc.line)
		}
	}
	if f.block("n", []byte{0xab}) != nil {
		t.Error("refused put stored a block")
	}
}
