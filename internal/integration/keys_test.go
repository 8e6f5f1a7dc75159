package integration

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/ctl"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestNamespaceControlCharsRefused (issue 33 item 10): a namespace with a
// control character (a newline broke pegactl's table) is refused by every
// entry point that takes one, each saying why, and none of them stores,
// pins or fetches anything.
func TestNamespaceControlCharsRefused(t *testing.T) {
	h := start(t, baseConfig(t, "node-h"))
	r := start(t, baseConfig(t, "node-r"))
	ctx := ctxT(t, 60*time.Second)
	const why = "control character (U+000A)"
	for _, ns := range []string{"ns\nx", "\n"} {
		hash := []byte("h1")
		// Each entry point's refusal, as its caller sees it.
		refusals := map[string]error{}
		_, err := testutil.PutBlock(ctx, h.local, ns, hash, []byte("data"), false)
		refusals["gRPC PutBlock"] = wantCode(err, codes.InvalidArgument)
		zc := h.cn.Client(t)
		refusals["data socket Put"] = wantIs(zc.Put(ctx, ns, hash, []byte("data")), pegaclient.ErrInvalid)
		_, err = zc.Alloc(ctx, ns, hash, 4)
		refusals["data socket Alloc"] = wantIs(err, pegaclient.ErrInvalid)
		_, err = zc.Lookup(ctx, ns, [][]byte{hash})
		refusals["data socket Lookup"] = wantIs(err, pegaclient.ErrInvalid)
		_, err = zc.Lease(ctx, ns, hash)
		refusals["data socket Lease"] = wantIs(err, pegaclient.ErrInvalid)
		_, err = testutil.GetBlock(ctx, h.local, ns, hash)
		refusals["gRPC GetBlock"] = wantCode(err, codes.InvalidArgument)
		_, err = h.local.ListBlocks(ctx, &pegadv1.ListBlocksRequest{Namespace: ns})
		refusals["gRPC ListBlocks"] = wantCode(err, codes.InvalidArgument)
		_, err = prefetch(ctx, r, h.d.PeerAddr(), ns, hash)
		refusals["gRPC Prefetch"] = wantCode(err, codes.InvalidArgument)
		_, err = query(ctx, peerClient(t, h.d.PeerAddr(), nil), "node-x", ns, hash)
		refusals["peer QueryBlocksForTransfer"] = wantCode(err, codes.InvalidArgument)
		for name, err := range refusals {
			if err != nil {
				t.Errorf("namespace %q, %s: %v", ns, name, err)
			}
		}

		// pegactl: a usage error (exit 2) with the daemon's reason, on one
		// line, and no table.
		f := filepath.Join(t.TempDir(), "k")
		if err := os.WriteFile(f, []byte("data"), 0o644); err != nil {
			t.Fatal(err)
		}
		stdout, stderr, code := runPegactl(h.d.SocketPath(), "blocks", "put", "--namespace", ns, "--hash", "ab", "--file", f)
		if code != ctl.ExitUsage || !strings.Contains(stderr, why) || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("pegactl blocks put --namespace %q: exit %d, stdout %q, stderr %q; want %d naming the %s",
				ns, code, stdout, stderr, ctl.ExitUsage, why)
		}
	}
	for _, n := range []*node{h, r} {
		resp, err := n.local.ListBlocks(ctx, &pegadv1.ListBlocksRequest{})
		if err != nil || len(resp.GetBlocks()) != 0 {
			t.Errorf("%s after the refusals: %d blocks (%v), want none", n.cfg.NodeID, len(resp.GetBlocks()), err)
		}
		if m := n.cn.Scrape(t); m[mSessionsActive] != 0 || m[mLockActive] != 0 {
			t.Errorf("%s after the refusals: %v sessions, %v locks, want none", n.cfg.NodeID, m[mSessionsActive], m[mLockActive])
		}
	}
}

// wantCode is nil when err is a gRPC status of code whose message names a
// control character.
func wantCode(err error, code codes.Code) error {
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), "control character") {
		return fmt.Errorf("got %v, want %v naming the control character", err, code)
	}
	return nil
}

// wantIs is nil when err is sentinel and names a control character.
func wantIs(err, sentinel error) error {
	if !errors.Is(err, sentinel) || !strings.Contains(err.Error(), "control character") {
		return fmt.Errorf("got %v, want %v naming the control character", err, sentinel)
	}
	return nil
}
