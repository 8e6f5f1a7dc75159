package holder

import (
	"context"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/metrics"
)

// EndHandoff ends a handoff on this node whose consumer is done with it
// (its pull is over; PrefetchRequest.end_handoff): the pins of the blocks
// it did not pull end now instead of at the ttl. The token's secret is the
// authority (Handoffs.Done compares it); the requester must still be who
// its certificate says, as in every peer call. A token naming no live
// handoff answers ended false.
func (s *Service) EndHandoff(ctx context.Context, req *pegadv1.EndHandoffRequest) (resp *pegadv1.EndHandoffResponse, err error) {
	defer s.done(metrics.RPCEndHandoff, &err)
	node, _, err := requesterOf(req.GetRequester(), "")
	if err != nil {
		return nil, invalid("%v", err)
	}
	if node, err = s.owner(ctx, node); err != nil {
		return nil, err
	}
	if s.opts.Handoffs == nil {
		return nil, status.Error(codes.Unavailable, "handoffs not served by this holder")
	}
	if len(req.GetToken()) > maxHandoffToken {
		return nil, invalid("handoff token of %d characters: at most %d", len(req.GetToken()), maxHandoffToken)
	}
	ended, n, err := s.opts.Handoffs.Done(req.GetToken())
	if err != nil { // only a malformed token
		return nil, invalid("%v", err)
	}
	s.opts.Log.Debug().Str("requester", node).Bool("ended", ended).Int("unpinned", n).Msg("Handoff ended by its consumer")
	return &pegadv1.EndHandoffResponse{Ended: ended, UnpinnedBlocks: uint32(n)}, nil
}
