package localapi

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/requester"
)

// TestFailedPrefetchBounds (issue 33, item 5): a failed prefetch answers
// its outcomes in the response when asked (failure_in_response), however
// many; without that, its status stays within a trailer a client with
// gRPC's C-core limit accepts: the outcomes as a detail while they fit,
// else left out and said so, and the message cut.
func TestFailedPrefetchBounds(t *testing.T) {
	cause := fmt.Errorf("read: %w", conn.ErrConnectionBroken)
	result := func(n int) *requester.Result {
		res := &requester.Result{}
		for i := range n {
			res.Blocks = append(res.Blocks, requester.BlockResult{Hash: []byte{byte(i >> 8), byte(i)},
				Status: requester.StatusFailed, Err: cause})
		}
		return res
	}

	resp, err := failedPrefetch(result(4096), cause, true)
	if err != nil || len(resp.GetBlocks()) != 4096 || resp.GetError().GetCode() != int32(codes.Unavailable) ||
		resp.GetError().GetReason() != string(pegaderr.Connection) || !strings.Contains(resp.GetError().GetMessage(), "connection") {
		t.Fatalf("in response: %v, error %v, %d blocks", err, resp.GetError(), len(resp.GetBlocks()))
	}

	_, err = failedPrefetch(result(2), cause, false)
	if detail := detailOf(err); status.Code(err) != codes.Unavailable || detail == nil || len(detail.GetBlocks()) != 2 {
		t.Fatalf("small legacy failure: %v, detail %v", err, detail)
	}
	_, err = failedPrefetch(result(256), cause, false)
	st := status.Convert(err)
	if code, reason := pegaderr.FromStatus(err); code != codes.Unavailable || reason != pegaderr.Connection ||
		detailOf(err) != nil || !strings.Contains(st.Message(), "the 256 per-block outcomes") {
		t.Fatalf("large legacy failure: %v (reason %q), detail %v", err, reason, detailOf(err))
	}
	if n := trailerBytes(st); n > 8<<10 {
		t.Errorf("large legacy failure's trailer is %d bytes, over the C core's 8 KiB", n)
	}

	long := fmt.Errorf("%w: %s", conn.ErrConnectionBroken, strings.Repeat("é", 4000))
	_, err = failedPrefetch(result(1), long, false)
	if m := status.Convert(err).Message(); len(m) > MaxPrefetchMessageBytes+64 || !strings.HasSuffix(m, "more bytes)") {
		t.Errorf("a long message went out as %d bytes: %.80q…", len(m), m)
	}
}

func detailOf(err error) *pegadv1.PrefetchResponse {
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*pegadv1.PrefetchResponse); ok {
			return r
		}
	}
	return nil
}

// trailerBytes approximates what st takes in a trailer: its message and
// its details, base64.
func trailerBytes(st *status.Status) int {
	p := st.Proto()
	n := len(p.GetMessage())
	for _, d := range p.GetDetails() {
		n += len(d.GetValue()) * 4 / 3
	}
	return n
}
