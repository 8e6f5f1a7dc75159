package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ctl"
)

// TestLocksHold (issue 23): `pegactl locks hold` locks a block on a real
// pegad's peer port, shows up in `locks list` while it holds, keeps the
// lock live past the lock timeout (3 s here) by renewing it, and releases
// it at the end; interrupted (Ctrl-C), it releases at once.
func TestLocksHold(t *testing.T) {
	const ns = "hold"
	h := start(t, baseConfig(t, "node-h"))
	blocks := randomBlocks(rand.New(rand.NewPCG(23, 5)), "b", 1, 1, 4096)
	putAll(t, h, ns, blocks)
	hash := fmt.Sprintf("%x", blocks[0].hash)
	sock := h.d.SocketPath()

	type held struct {
		out, errOut string
		code        int
	}
	hold := func(ctx context.Context, dur string) <-chan held {
		done := make(chan held, 1)
		go func() {
			var out, errb bytes.Buffer
			code := ctl.Main(ctx, []string{"--socket", sock, "-o", "json", "locks", "hold", "--peer", h.d.PeerAddr(),
				"--namespace", ns, "--for", dur, hash}, ctl.Streams{In: strings.NewReader(""), Out: &out, Err: &errb})
			done <- held{out.String(), errb.String(), code}
		}()
		return done
	}
	// listed waits until `locks list` shows one session on the block.
	listed := func() string {
		var id string
		eventually(t, "locks list shows the held lock", 10*time.Second, func() error {
			stdout, stderr, code := runPegactl(sock, "-o", "json", "locks", "list")
			var l struct {
				Sessions []struct {
					SessionID   string `json:"session_id"`
					RequesterID string `json:"requester_id"`
					Blocks      []struct{ Hash string }
				}
			}
			if code != 0 || json.Unmarshal([]byte(stdout), &l) != nil {
				return fmt.Errorf("locks list: exit %d %s%s", code, stdout, stderr)
			}
			if len(l.Sessions) != 1 || len(l.Sessions[0].Blocks) != 1 || l.Sessions[0].Blocks[0].Hash != hash ||
				!strings.HasPrefix(l.Sessions[0].RequesterID, "pegactl@") {
				return fmt.Errorf("sessions %+v", l.Sessions)
			}
			id = l.Sessions[0].SessionID
			return nil
		})
		return id
	}

	start := time.Now()
	done := hold(context.Background(), "4s")
	id := listed()
	r := <-done
	if r.code != 0 || !strings.Contains(r.out, `"session_id": "`+id+`"`) || !strings.Contains(r.out, `"was_live": true`) ||
		!strings.Contains(r.out, `"end": "released"`) {
		t.Fatalf("hold for 4s (lock timeout 3s): exit %d\n%s%s\nwant the session released live at the end", r.code, r.out, r.errOut)
	}
	if took := time.Since(start); took < 4*time.Second {
		t.Fatalf("hold for 4s ended after %v", took)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done = hold(ctx, "1m")
	listed()
	cancel() // Ctrl-C
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("an interrupted hold did not end")
	}
	if r.code != 0 || !strings.Contains(r.out, `"end": "released"`) {
		t.Fatalf("interrupted hold: exit %d\n%s%s", r.code, r.out, r.errOut)
	}
	if stdout, _, _ := runPegactl(sock, "-o", "json", "locks", "list"); !strings.Contains(stdout, `"sessions": []`) {
		t.Fatalf("a lock is left after the hold:\n%s", stdout)
	}

	// Ctrl-C before the lock's reply came (here: before the command ran)
	// still releases what the holder locked, and is no error.
	ctx, cancel = context.WithCancel(context.Background())
	cancel()
	r = <-hold(ctx, "1m")
	if r.code != 0 || !strings.Contains(r.out, `"end": "released"`) {
		t.Fatalf("hold interrupted while locking: exit %d\n%s%s", r.code, r.out, r.errOut)
	}
	if stdout, _, _ := runPegactl(sock, "-o", "json", "locks", "list"); !strings.Contains(stdout, `"sessions": []`) {
		t.Fatalf("a lock is left after a hold interrupted while locking:\n%s", stdout)
	}
}
