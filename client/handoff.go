package client

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// Handoff is a prefill/decode handoff (Client.Handoff): blocks pinned on
// this node for a consumer on another node, which pulls them with
// Prefetch(..., FromPeer(PeerAddr), WithHandoff(Token)). The pin ends
// when that pull has read every block, when TTL passes, or at Release.
type Handoff struct {
	// Token is opaque: pass it on as is.
	Token  string
	Blocks int
	Bytes  uint64
	// NodeID and PeerAddr are this node and its peer address as peers
	// dial it (--advertise).
	NodeID   string
	PeerAddr string
	TTL      time.Duration
	Expires  time.Time

	local pegadv1.LocalServiceClient
}

// Handoff pins every block of hashes in namespace for a consumer on
// another node, for ttl (0: the daemon's default, 30 s; at most 300 s).
// ErrNotFound when a block is not stored here (nothing is pinned then).
func (c *Client) Handoff(ctx context.Context, namespace string, hashes [][]byte, ttl time.Duration) (*Handoff, error) {
	req := &pegadv1.HandoffRequest{Namespace: namespace, Hashes: hashes}
	if ttl != 0 {
		req.Ttl = durationpb.New(ttl)
	}
	resp, err := c.local.Handoff(ctx, req)
	if err != nil {
		return nil, fromStatus(err)
	}
	return &Handoff{
		Token: resp.GetToken(), Blocks: int(resp.GetBlocks()), Bytes: resp.GetBytes(),
		NodeID: resp.GetNodeId(), PeerAddr: resp.GetPeerAddr(), TTL: resp.GetTtl().AsDuration(),
		Expires: resp.GetExpiresAt().AsTime(), local: c.local,
	}, nil
}

// Release ends the handoff now. Idempotent: released is false when it
// had ended already (pulled, expired or released).
func (h *Handoff) Release(ctx context.Context) (released bool, err error) {
	resp, err := h.local.ReleaseHandoff(ctx, &pegadv1.ReleaseHandoffRequest{Token: h.Token})
	if err != nil {
		return false, fromStatus(err)
	}
	return resp.GetReleased(), nil
}
