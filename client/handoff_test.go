package client_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/pegaflow/pegad/client"
)

// Handoff and a Prefetch naming it, between two daemons: the pull ends
// the handoff's pins; KnownPeerOnly refuses a peer nothing can check.
func TestHandoffAndPull(t *testing.T) {
	prod, cons := startNode(t, nil), startNode(t, nil)
	pc, cc := prod.dial(t), cons.dial(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hashes := [][]byte{[]byte("a"), []byte("b")}
	for _, h := range hashes {
		if err := pc.Put(ctx, "pd", h, []byte(strings.Repeat(string(h), 4096))); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pc.Handoff(ctx, "pd", append(hashes, []byte("missing")), 0); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Handoff with a missing block = %v, want ErrNotFound", err)
	}
	h, err := pc.Handoff(ctx, "pd", hashes, 10*time.Second)
	if err != nil || h.Blocks != 2 || h.PeerAddr != prod.peer || h.TTL != 10*time.Second {
		t.Fatalf("Handoff = %+v, %v", h, err)
	}
	if got := prod.stats(t).GetPinnedBlocks(); got != 2 {
		t.Fatalf("pinned after Handoff = %d, want 2", got)
	}
	if _, err := cc.Prefetch(ctx, "pd", hashes, client.FromPeer(h.PeerAddr), client.KnownPeerOnly()); !errors.Is(err, client.ErrDenied) {
		t.Fatalf("Prefetch KnownPeerOnly standalone = %v, want ErrDenied", err)
	}
	if _, err := cc.Prefetch(ctx, "pd", hashes, client.FromPeer(h.PeerAddr), client.WithHandoff(h.Token)); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for prod.stats(t).GetPinnedBlocks() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("still %d pinned after the pull", prod.stats(t).GetPinnedBlocks())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if released, err := h.Release(ctx); released || err != nil {
		t.Fatalf("Release after the pull = %v, %v; want false", released, err)
	}
}
