package integration

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/pegaflow/pegad/api/limits"
	"github.com/pegaflow/pegad/internal/ctl"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestPegactlSplitsLongHashLists (issue 33 item 10): pegactl takes more
// hashes than one request may name (limits.MaxBlocksPerRequest) and
// splits them, for prefetch and blocks where, instead of passing pegad's
// refusal on: every hash gets its row, in the order given.
func TestPegactlSplitsLongHashLists(t *testing.T) {
	const ns = "many"
	n := limits.MaxBlocksPerRequest + 4
	rd := testutil.StartRedis(t)
	h := startClusterNode(t, "h", rd)
	r := startClusterNode(t, "r", rd)
	// The holder has the first block of the first batch and the last of
	// the second; the rest are nowhere.
	hexes := make([]string, n)
	for i := range hexes {
		hexes[i] = fmt.Sprintf("%04x", i)
	}
	have := []block{
		{hash: []byte{0x00, 0x00}, body: []byte("first")},
		{hash: []byte{byte((n - 1) >> 8), byte(n - 1)}, body: []byte("last")},
	}
	putAll(t, h, ns, have)
	waitHolders(t, r, ns, map[string]string{string(have[0].hash): "h", string(have[1].hash): "h"})

	stdout, stderr, code := runPegactl(r.d.SocketPath(), append([]string{"-o", "json", "blocks", "where", "--namespace", ns}, hexes...)...)
	var where struct {
		Blocks []struct {
			Hash    string `json:"hash"`
			Holders []struct {
				NodeID string `json:"node_id"`
			} `json:"holders"`
		} `json:"blocks"`
	}
	if code != 0 || json.Unmarshal([]byte(stdout), &where) != nil || len(where.Blocks) != n {
		t.Fatalf("blocks where of %d hashes: exit %d, %d rows, stderr %q; want 0 and %d rows", n, code, len(where.Blocks), stderr, n)
	}
	for i, b := range where.Blocks {
		held := i == 0 || i == n-1
		if b.Hash != hexes[i] || (len(b.Holders) == 1 && b.Holders[0].NodeID == "h") != held {
			t.Fatalf("blocks where row %d = %+v, want %s held %v", i, b, hexes[i], held)
		}
	}

	stdout, stderr, code = runPegactl(r.d.SocketPath(), append([]string{"-o", "json", "prefetch", "--peer", h.d.PeerAddr(), "--namespace", ns}, hexes...)...)
	var pre struct {
		SessionID string `json:"session_id"`
		Bytes     uint64 `json:"bytes"`
		Blocks    []struct {
			Hash   string `json:"hash"`
			Status string `json:"status"`
		} `json:"blocks"`
	}
	// Blocks the peer lacks: exit 3, as for one request.
	if code != ctl.ExitNotFound || json.Unmarshal([]byte(stdout), &pre) != nil || len(pre.Blocks) != n {
		t.Fatalf("prefetch of %d hashes: exit %d, %d rows, stderr %q; want %d and %d rows", n, code, len(pre.Blocks), stderr, ctl.ExitNotFound, n)
	}
	for i, b := range pre.Blocks {
		want := b.Status != "fetched"
		if i == 0 || i == n-1 {
			want = b.Status == "fetched"
		}
		if b.Hash != hexes[i] || !want {
			t.Fatalf("prefetch row %d = %+v, want %s fetched only if the holder has it", i, b, hexes[i])
		}
	}
	if pre.Bytes != uint64(len("first")+len("last")) {
		t.Errorf("prefetch bytes = %d, want the two blocks' %d", pre.Bytes, len("first")+len("last"))
	}
	for _, b := range have {
		if got, err := get(ctxT(t, 10*time.Second), r, ns, b.hash); err != nil || string(got) != string(b.body) {
			t.Errorf("block %x on the requester: %q, %v; want %q", b.hash, got, err, b.body)
		}
	}
}
