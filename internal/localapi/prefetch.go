package localapi

import (
	"fmt"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/requester"
)

// Bounds of a failed prefetch's status (issue 33, item 5). A status goes
// out in the trailer, as grpc-message and grpc-status-details-bin
// (base64), and a trailer past the client's header-list limit (8 KiB by
// default in gRPC's C core, which Python uses) reaches the client as a
// bare RST_STREAM, the outcomes and the error both lost.
const (
	// MaxPrefetchDetailBytes bounds the PrefetchResponse attached to a
	// failed prefetch's status (encoded; base64 makes it a third larger).
	// An answer larger than that is left out and the message says so: a
	// client that needs every outcome asks with failure_in_response.
	MaxPrefetchDetailBytes = 3 << 10
	// MaxPrefetchMessageBytes bounds a failed prefetch's message: a
	// cluster prefetch's error joins one per failed block.
	MaxPrefetchMessageBytes = 2 << 10
)

// failedPrefetch answers a prefetch that failed as a whole with res, its
// per-block outcomes (nil when it failed before trying any block).
// inResponse (PrefetchRequest.failure_in_response): the call succeeds,
// with the failure in the response beside every outcome, however many.
// Without it (older clients) the call fails with the failure's status and
// the outcomes as a detail only while they fit MaxPrefetchDetailBytes.
func failedPrefetch(res *requester.Result, err error, inResponse bool) (*pegadv1.PrefetchResponse, error) {
	st := status.Convert(toStatus(err))
	msg := boundMessage(st.Message())
	_, reason := pegaderr.FromStatus(st.Err())
	if res == nil {
		return nil, pegaderr.Status(st.Code(), reason, msg).Err()
	}
	out := prefetchResponse(res)
	if inResponse {
		out.Error = &pegadv1.PrefetchFailure{Code: int32(st.Code()), Reason: string(reason), Message: msg}
		return out, nil
	}
	if n := proto.Size(out); n > MaxPrefetchDetailBytes {
		msg += fmt.Sprintf(" (the %d per-block outcomes, %d bytes, are too many for a status trailer: ask with failure_in_response)",
			len(out.GetBlocks()), n)
		return nil, pegaderr.Status(st.Code(), reason, msg).Err()
	}
	bounded := pegaderr.Status(st.Code(), reason, msg)
	if ds, derr := bounded.WithDetails(out); derr == nil {
		bounded = ds
	}
	return nil, bounded.Err()
}

// boundMessage cuts msg to MaxPrefetchMessageBytes, saying how much went.
func boundMessage(msg string) string {
	if len(msg) <= MaxPrefetchMessageBytes {
		return msg
	}
	cut := MaxPrefetchMessageBytes
	for cut > 0 && !utf8Start(msg[cut]) {
		cut--
	}
	return fmt.Sprintf("%s… (%d more bytes)", msg[:cut], len(msg)-cut)
}

// utf8Start reports whether b starts a UTF-8 sequence (a cut there keeps
// the text valid, which gRPC's message requires).
func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

func prefetchResponse(res *requester.Result) *pegadv1.PrefetchResponse {
	out := &pegadv1.PrefetchResponse{
		Bytes:     res.Bytes,
		Duration:  durationpb.New(res.Duration),
		SessionId: res.SessionID,
	}
	for _, b := range res.Blocks {
		r := &pegadv1.PrefetchBlockResult{Hash: b.Hash, Status: prefetchStatus(b.Status), Node: b.Node}
		if b.Err != nil {
			r.Error = b.Err.Error()
		}
		out.Blocks = append(out.Blocks, r)
	}
	return out
}

func prefetchStatus(s requester.Status) pegadv1.PrefetchBlockStatus {
	switch s {
	case requester.StatusFetched:
		return pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FETCHED
	case requester.StatusAlreadyLocal:
		return pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_ALREADY_LOCAL
	case requester.StatusMissingOnPeer:
		return pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_MISSING_ON_PEER
	case requester.StatusFailed:
		return pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_FAILED
	case requester.StatusDiscarded:
		return pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_DISCARDED
	case requester.StatusNotFound:
		return pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_NOT_FOUND
	case requester.StatusNotFetched:
		return pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_NOT_FETCHED
	}
	return pegadv1.PrefetchBlockStatus_PREFETCH_BLOCK_STATUS_UNSPECIFIED
}
