package localapi

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/handoff"
)

// Handoff pins blocks for a consumer on another node (internal/handoff)
// and answers where it is to pull them from.
func (l *Local) Handoff(_ context.Context, req *pegadv1.HandoffRequest) (*pegadv1.HandoffResponse, error) {
	if l.handoffs == nil {
		return nil, statusf(codes.Unavailable, pegaderr.Internal, "handoffs not served")
	}
	var ttl = handoff.DefaultTTL
	if t := req.GetTtl(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, invalidf("ttl: %v", err)
		}
		ttl = t.AsDuration()
		if ttl <= 0 {
			return nil, invalidf("ttl must be positive (omit it for the default %s)", handoff.DefaultTTL)
		}
	}
	h, err := l.handoffs.Open(req.GetNamespace(), req.GetHashes(), ttl)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pegadv1.HandoffResponse{
		Token: h.Token, Blocks: uint32(h.Blocks), Bytes: h.Bytes, NodeId: l.self, PeerAddr: l.advertise,
		Ttl: durationpb.New(h.TTL), ExpiresAt: timestamppb.New(h.Expires),
	}, nil
}

// ReleaseHandoff ends a handoff early; a token naming none is OK.
func (l *Local) ReleaseHandoff(_ context.Context, req *pegadv1.ReleaseHandoffRequest) (*pegadv1.ReleaseHandoffResponse, error) {
	if l.handoffs == nil {
		return nil, statusf(codes.Unavailable, pegaderr.Internal, "handoffs not served")
	}
	released, n, err := l.handoffs.Release(req.GetToken())
	if err != nil {
		return nil, toStatus(err)
	}
	return &pegadv1.ReleaseHandoffResponse{Released: released, ReleasedBlocks: uint32(n)}, nil
}
