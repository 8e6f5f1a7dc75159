package requester

import (
	"context"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// endHandoff tells the holder that the consumer is done with the handoff
// st pulled (Request.EndHandoff), so that its pins of blocks this fetch
// did not read (found local, or not asked for) end now, not at its ttl.
// Best effort and off the fetch's latency: a goroutine the engine owns
// (Close waits for it through e.wg), bounded by the release timeout and
// not by the fetch's ctx, which may have ended already; a failure leaves
// the pins to the ttl and is logged. The caller holds an e.wg count.
func (e *Engine) endHandoff(st *fetchState) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		client, err := e.peers(st.peer)
		if err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), e.releaseTimeout)
			var resp *pegadv1.EndHandoffResponse
			resp, err = client.EndHandoff(ctx, &pegadv1.EndHandoffRequest{Requester: e.requester(), Token: st.handoff})
			cancel()
			if err == nil {
				e.log.Debug().Str("req_id", st.reqID).Str("remote", st.peer).Bool("ended", resp.GetEnded()).
					Uint32("unpinned", resp.GetUnpinnedBlocks()).Msg("Handoff ended at the holder")
				return
			}
		}
		e.log.Info().Err(err).Str("req_id", st.reqID).Str("remote", st.peer).
			Msg("Handoff not ended at the holder: its pins last until its ttl")
	}()
}
