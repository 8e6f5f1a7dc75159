package client_test

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/client"
)

// helperEnv makes the test binary act as a client process holding leases
// (see helperMain) instead of running tests.
const helperEnv = "PEGAD_CLIENT_TEST_HELPER_SOCKET"

// helperAdoptEnv, beside helperEnv, makes the helper adopt the pin whose
// token it holds instead, say "ready <blocks>" and wait to be killed.
const helperAdoptEnv = "PEGAD_CLIENT_TEST_HELPER_ADOPT"

// helperMain, in a re-executed test binary, dials the socket named in
// helperEnv, leases block "k", allocates 8192 bytes for block "w", writes
// half of them, puts block "p" of 4096 bytes (which leaves 4096 bytes
// reserved for its next Put), says "ready" and waits to be killed. It reports whether it
// ran (the process then exits without running tests).
// startHelper runs this test binary as a client process (helperMain, with
// env) and waits for its first line to be ready; it is killed at cleanup.
func startHelper(t *testing.T, ready string, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != ready {
		t.Fatalf("helper said %q (%v), want %q", line, err, ready)
	}
	return cmd
}

func helperMain() bool {
	socket := os.Getenv(helperEnv)
	if socket == "" {
		return false
	}
	fail := func(err error) {
		fmt.Println("error:", err)
		os.Exit(2)
	}
	ctx := context.Background()
	c, err := client.Dial(ctx, socket)
	if err != nil {
		fail(err)
	}
	if tok := os.Getenv(helperAdoptEnv); tok != "" {
		raw, err := hex.DecodeString(tok)
		if err != nil {
			fail(err)
		}
		rs, err := c.Adopt(ctx, raw)
		if err != nil {
			fail(err)
		}
		fmt.Println("ready", len(rs))
		time.Sleep(time.Minute)
		os.Exit(3)
	}
	if _, err := c.Lease(ctx, "ns", []byte("k")); err != nil {
		fail(err)
	}
	w, err := c.Alloc(ctx, "ns", []byte("w"), 8192)
	if err != nil {
		fail(err)
	}
	copy(w.Bytes()[:4096], make([]byte, 4096))
	if err := c.Put(ctx, "ns", []byte("p"), make([]byte, 4096)); err != nil {
		fail(err)
	}
	fmt.Println("ready")
	time.Sleep(time.Minute)
	os.Exit(3)
	return true
}

// TestKilledClientLeavesNothing: a client process killed with SIGKILL in
// the middle of a read lease and a write allocation, with room reserved
// for its next Put, leaves no pin, no allocated memory and no half-written
// block in the daemon (only the block it put).
func TestKilledClientLeavesNothing(t *testing.T) {
	n := startNode(t, nil) // lock-timeout 2 min: only the disconnect can end these leases in time
	c := n.dial(t)
	ctx := context.Background()
	if err := c.Put(ctx, "ns", []byte("k"), pattern(5000, 1)); err != nil {
		t.Fatal(err)
	}
	base := blockBytes(5000)
	if used := n.stats(t).GetPoolUsed(); used != base+5056 {
		t.Fatalf("pool used %d, want the block and a spare of %d", used, 5056)
	}
	if err := c.Close(); err != nil { // its spare goes
		t.Fatal(err)
	}
	c = n.dial(t)

	cmd := startHelper(t, "ready", helperEnv+"="+n.socket)
	if st := n.stats(t); st.GetPinnedBlocks() != 1 || st.GetPoolUsed() != base+8192+2*4096 {
		t.Fatalf("with the helper's leases: %+v, want 1 pinned and %d used", st, base+8192+2*4096)
	}
	if err := cmd.Process.Signal(os.Kill); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	n.waitStats(t, "after kill -9", func(st *pegadv1.StatsResponse) bool {
		return st.GetPinnedBlocks() == 0 && st.GetPoolUsed() == base+4096 && st.GetBlocks() == 2
	})
	if _, err := c.Lease(ctx, "ns", []byte("w")); err == nil {
		t.Fatal("the killed client's allocation was indexed")
	}
}
