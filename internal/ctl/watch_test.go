package ctl

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// runFor runs pegactl until it ends or d passes (then it is interrupted,
// as Ctrl-C would).
func runFor(t *testing.T, f *fakeDaemon, d time.Duration, args ...string) ran {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out, errb bytes.Buffer
	code := Main(ctx, append([]string{"--socket", f.socket}, args...), Streams{In: bytes.NewReader(nil), Out: &out, Err: &errb})
	return ran{stdout: out.String(), stderr: errb.String(), code: code}
}

// TestWatch: --watch re-runs list and stats commands until interrupted,
// which ends them with exit 0; tables get an "Every" header per round,
// JSON one document per round.
func TestWatch(t *testing.T) {
	f := startFake(t)
	for _, args := range [][]string{{"stats"}, {"sessions", "list"}, {"conns", "list"}, {"blocks", "list"}, {"locks", "list"}} {
		r := runFor(t, f, 700*time.Millisecond, append(args, "--watch", "200ms")...)
		if r.code != 0 || r.stderr != "" {
			t.Fatalf("%v --watch: %+v", args, r)
		}
		if n := strings.Count(r.stdout, "Every 200ms: pegactl "+strings.Join(args, " ")); n < 2 {
			t.Errorf("%v --watch: %d rounds in 700ms, want >= 2:\n%s", args, n, r.stdout)
		}
	}
	r := runFor(t, f, 500*time.Millisecond, "-o", "json", "stats", "--watch", "150ms")
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	docs := 0
	for {
		var s statsResult
		if err := dec.Decode(&s); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("json round %d: %v\n%s", docs, err, r.stdout)
		}
		docs++
	}
	if r.code != 0 || docs < 2 {
		t.Fatalf("json --watch: code %d, %d documents", r.code, docs)
	}
	wantError(t, run(t, f, "stats", "--watch", "-1s"), ExitUsage, "invalid --watch")
	// A failure ends the watch with its exit code.
	f.mu.Lock()
	f.errs["Stats"] = status.Error(codes.Unavailable, "pegad is draining")
	f.mu.Unlock()
	wantError(t, runFor(t, f, 2*time.Second, "stats", "--watch", "100ms"), ExitUnavailable, "pegad is draining")
}

// TestSort: --sort orders list rows by a key, -KEY descending; an unknown
// key is a usage error naming the valid ones.
func TestSort(t *testing.T) {
	f := startFake(t)
	f.mu.Lock()
	s0 := f.sessions.Sessions[0]
	f.sessions.Sessions = append(f.sessions.Sessions,
		&pegadv1.HolderSession{SessionId: "aa", RequesterId: "node-z", Blocks: 9, Bytes: 1, Age: durationpb.New(time.Hour), ExpiresIn: durationpb.New(time.Second)},
		&pegadv1.HolderSession{SessionId: "bb", RequesterId: "node-a", Blocks: 1, Bytes: 9 << 30, Age: durationpb.New(time.Millisecond), ExpiresIn: durationpb.New(time.Minute)})
	f.mu.Unlock()
	order := func(args ...string) []string {
		t.Helper()
		r := run(t, f, append([]string{"-o", "json", "sessions", "list"}, args...)...)
		var res sessionsResult
		decodeJSON(t, r.stdout, &res)
		var ids []string
		for _, s := range res.Sessions {
			ids = append(ids, s.SessionID)
		}
		return ids
	}
	tests := []struct {
		sort string
		want string
	}{
		{"", s0.SessionId + ",aa,bb"},
		{"age", "bb," + s0.SessionId + ",aa"},
		{"-age", "aa," + s0.SessionId + ",bb"},
		{"-bytes", "bb," + s0.SessionId + ",aa"},
		{"requester", "bb," + s0.SessionId + ",aa"},
		{"-blocks", "aa," + s0.SessionId + ",bb"},
	}
	for _, tc := range tests {
		args := []string{}
		if tc.sort != "" {
			args = append(args, "--sort", tc.sort)
		}
		if got := strings.Join(order(args...), ","); got != tc.want {
			t.Errorf("--sort %q: %s, want %s", tc.sort, got, tc.want)
		}
	}
	wantError(t, run(t, f, "sessions", "list", "--sort", "colour"), ExitUsage,
		`invalid --sort "colour": want one of age, blocks, bytes, expires, requester`)
	wantError(t, run(t, f, "conns", "list", "--sort", "x"), ExitUsage, "age, node, peer, qps, role, state")
	wantError(t, run(t, f, "blocks", "list", "--sort", "x"), ExitUsage, "bytes, hash, idle, namespace, pins")
}

// TestBlocksListIdle: the table shows how long ago each block was used,
// not a timestamp; JSON keeps the timestamp.
func TestBlocksListIdle(t *testing.T) {
	f := startFake(t)
	r := run(t, f, "blocks", "list")
	if !strings.Contains(r.stdout, "IDLE") || strings.Contains(r.stdout, "2026-12-02T") {
		t.Fatalf("table shows a timestamp, not an age:\n%s", r.stdout)
	}
	r = run(t, f, "-o", "json", "blocks", "list")
	if !strings.Contains(r.stdout, `"last_access": "2026-12-02T15:01:00Z"`) {
		t.Fatalf("json lost last_access:\n%s", r.stdout)
	}
}

// TestLocksList: locks list shows each session's locked blocks, one row
// per block grouped under its session; JSON nests them.
func TestLocksList(t *testing.T) {
	f := startFake(t)
	r := run(t, f, "locks", "list")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if r.code != 0 || len(lines) != 3 || !strings.HasPrefix(lines[0], "SESSION") ||
		!strings.Contains(lines[1], "00112233445566778899aabbccddeeff") || !strings.Contains(lines[1], "9f2c") ||
		!strings.Contains(lines[1], "2.0 MiB") || !strings.Contains(lines[2], "77") || strings.Contains(lines[2], "node-b") {
		t.Fatalf("locks list:\n%s", r.stdout)
	}
	r = run(t, f, "-o", "json", "locks", "list")
	var res locksResult
	decodeJSON(t, r.stdout, &res)
	if len(res.Sessions) != 1 || len(res.Sessions[0].Blocks) != 2 || res.Sessions[0].Blocks[1] != (lockedBlockJSON{Namespace: "llama", Hash: "77", Bytes: 1 << 20}) {
		t.Fatalf("locks list json: %+v", res)
	}
}

// TestConnsListHolderRow: a holder row shows the requester's advertised
// address and node id; JSON keeps the connection's own address too.
func TestConnsListHolderRow(t *testing.T) {
	f := startFake(t)
	f.mu.Lock()
	f.conns.Conns = append(f.conns.Conns, &pegadv1.Conn{Peer: "10.0.0.2:41234", State: "connected", Role: "holder",
		RemoteNodeId: "node-b", RemoteAdvertise: "10.0.0.2:50055", Qps: 2, Age: durationpb.New(time.Second)})
	f.mu.Unlock()
	r := run(t, f, "conns", "list")
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[2], "10.0.0.2:50055") || !strings.Contains(lines[2], "node-b") {
		t.Fatalf("conns list:\n%s", r.stdout)
	}
	r = run(t, f, "-o", "json", "conns", "list")
	var res connsResult
	decodeJSON(t, r.stdout, &res)
	if c := res.Conns[1]; c.Peer != "10.0.0.2:41234" || c.RemoteAdvertise != "10.0.0.2:50055" {
		t.Fatalf("json: %+v", c)
	}
}

// lateCtx is a context whose deadline has passed but whose timer has not
// fired: what a loaded runtime shows a watch for a moment at its end.
type lateCtx struct{ context.Context }

func (lateCtx) Deadline() (time.Time, bool) { return time.Now().Add(-time.Millisecond), true }

// TestWatchEndsAtItsDeadline: a round whose call fails because the watch's
// own deadline passed ends the watch with exit 0, as an interrupt does,
// even before the context says it is done (a TestWatch flake under load:
// "timed out: context deadline exceeded", exit 1).
func TestWatchEndsAtItsDeadline(t *testing.T) {
	f := startFake(t)
	var out, errb bytes.Buffer
	code := Main(lateCtx{context.Background()}, []string{"--socket", f.socket, "stats", "--watch", "100ms"},
		Streams{In: bytes.NewReader(nil), Out: &out, Err: &errb})
	if code != 0 || errb.Len() != 0 {
		t.Fatalf("watch past its deadline: exit %d, stderr %q, want 0 and nothing", code, errb.String())
	}
}
