package ctl

import (
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

func setTerminal(t *testing.T, tty bool) {
	t.Helper()
	old, oldEvery := stderrIsTerminal, progressEvery
	stderrIsTerminal = func(io.Writer) bool { return tty }
	progressEvery = 50 * time.Millisecond
	t.Cleanup(func() { stderrIsTerminal, progressEvery = old, oldEvery })
}

// slowFetch makes the fake's prefetch take 400ms while it lists a fetch
// to peer 10.0.0.9:50055 with 1 of 4 MiB read.
func slowFetch(t *testing.T, f *fakeDaemon) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.prefetchDelay = 400 * time.Millisecond
	f.prefetchRes = &pegadv1.PrefetchResponse{Bytes: 4 << 20, Blocks: []*pegadv1.PrefetchBlockResult{
		{Hash: []byte{0xaa}, Status: pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED}}}
	f.sessions.Fetches = []*pegadv1.Fetch{{ReqId: "r1", Peer: "10.0.0.9:50055", Blocks: 4, Bytes: 4 << 20, BytesDone: 1 << 20,
		Age: durationpb.New(100 * time.Millisecond), Phase: "read"}}
}

// TestPrefetchProgress: on a terminal, prefetch draws a progress line on
// stderr (phase, blocks, bytes done of total, rate, ETA) and erases it;
// stdout holds only the result.
func TestPrefetchProgress(t *testing.T) {
	setTerminal(t, true)
	f := startFake(t)
	slowFetch(t, f)
	r := run(t, f, "prefetch", "--peer", "10.0.0.9:50055", "--namespace", "ns", "aa")
	if r.code != 0 {
		t.Fatalf("prefetch: %+v", r)
	}
	for _, want := range []string{"\rprefetch 10.0.0.9:50055: read 4 blocks, 1.0 MiB of 4.0 MiB (25%), 10.0 MiB/s, ETA 0s", "\033[K", "\r\033[K"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("stderr lacks %q: %q", want, r.stderr)
		}
	}
	if !strings.HasSuffix(r.stderr, "\r\033[K") {
		t.Errorf("progress line not erased at the end: %q", r.stderr)
	}
	if strings.Contains(r.stdout, "\r") || !strings.Contains(r.stdout, "fetched") {
		t.Errorf("stdout: %q", r.stdout)
	}
}

// TestPrefetchNoProgress: no progress line into a pipe or file, nor with
// -o json.
func TestPrefetchNoProgress(t *testing.T) {
	for _, tc := range []struct {
		tty  bool
		args []string
	}{{false, nil}, {true, []string{"-o", "json"}}} {
		setTerminal(t, tc.tty)
		f := startFake(t)
		slowFetch(t, f)
		r := run(t, f, append(tc.args, "prefetch", "--peer", "10.0.0.9:50055", "--namespace", "ns", "aa")...)
		if r.code != 0 || r.stderr != "" {
			t.Errorf("tty=%v %v: code %d stderr %q", tc.tty, tc.args, r.code, r.stderr)
		}
	}
}

func TestProgressLine(t *testing.T) {
	f := &pegadv1.Fetch{Peer: "p:1", Phase: "lock", Age: durationpb.New(time.Second)}
	if got := progressLine(f, 1500*time.Millisecond); got != "prefetch p:1: lock, 1.5s" {
		t.Errorf("before the lock: %q", got)
	}
	f = &pegadv1.Fetch{Peer: "p:1", Phase: "read", Blocks: 381, Bytes: 1 << 30, BytesDone: 256 << 20, Age: durationpb.New(2 * time.Second)}
	if got := progressLine(f, 2*time.Second); got != "prefetch p:1: read 381 blocks, 256.0 MiB of 1.0 GiB (25%), 128.0 MiB/s, ETA 6s, 2s" {
		t.Errorf("reading: %q", got)
	}
}

// TestPrefetchGroupsFailures: 400 blocks failing the same way print one
// row with a count, the error without gRPC's wrapping; JSON keeps one
// entry per block.
func TestPrefetchGroupsFailures(t *testing.T) {
	f := startFake(t)
	res := &pegadv1.PrefetchResponse{}
	args := []string{"prefetch", "--peer", "10.0.0.1:50055", "--namespace", "ns"}
	wrapped := "requester: release: rpc error: code = Unavailable desc = peer closed the connection"
	for i := range 402 {
		b := &pegadv1.PrefetchBlockResult{Hash: []byte{byte(i >> 8), byte(i)}, Status: pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED, Error: wrapped}
		switch i {
		case 0:
			b.Status, b.Error = pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED, ""
		case 401:
			b.Status, b.Error = pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_MISSING_ON_PEER, ""
		}
		res.Blocks = append(res.Blocks, b)
		args = append(args, hexOf(b.Hash))
	}
	f.mu.Lock()
	f.prefetchRes = res
	f.mu.Unlock()
	r := run(t, f, args...)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != ExitError || len(lines) != 5 {
		t.Fatalf("code %d, %d lines:\n%s", r.code, len(lines), r.stdout)
	}
	if !strings.Contains(lines[2], "0001 (+399 more)") || !strings.Contains(lines[2], "failed") ||
		!strings.HasSuffix(strings.TrimSpace(lines[2]), "requester: release: peer closed the connection") {
		t.Errorf("grouped row: %q", lines[2])
	}
	if strings.Contains(r.stdout, "rpc error") {
		t.Errorf("gRPC wrapping printed:\n%s", r.stdout)
	}
	r = run(t, f, append([]string{"-o", "json"}, args...)...)
	var out prefetchResult
	decodeJSON(t, r.stdout, &out)
	if len(out.Blocks) != 402 || out.Blocks[5].Error != "requester: release: peer closed the connection" {
		t.Errorf("json: %d blocks, error %q", len(out.Blocks), out.Blocks[5].Error)
	}
}

// TestSessionsListBytesDone: a fetch shows bytes done of its total.
func TestSessionsListBytesDone(t *testing.T) {
	f := startFake(t)
	slowFetch(t, f)
	r := run(t, f, "sessions", "list")
	if !strings.Contains(r.stdout, "DONE") || !strings.Contains(r.stdout, "1.0 MiB of 4.0 MiB") {
		t.Fatalf("sessions list:\n%s", r.stdout)
	}
	r = run(t, f, "-o", "json", "sessions", "list")
	if !strings.Contains(r.stdout, `"bytes_done": 1048576`) {
		t.Fatalf("json:\n%s", r.stdout)
	}
}
