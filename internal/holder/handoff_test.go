package holder

import (
	"context"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/store"
)

// fakeHandoffs records what the holder asks of the node's handoffs.
type fakeHandoffs struct {
	mu   sync.Mutex // guards done
	done []string
}

func (f *fakeHandoffs) Pulled(string, []store.Key) int { return 0 }

func (f *fakeHandoffs) Done(tok string) (bool, int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.done = append(f.done, tok)
	return tok == "live", 3, nil
}

// TestEndHandoff: the consumer's EndHandoff reaches Handoffs.Done with
// its token; a request without a requester, with a token too long to be
// one, or to a holder that serves no handoffs changes nothing.
func TestEndHandoff(t *testing.T) {
	me := &pegadv1.Requester{NodeId: "consumer", Incarnation: "c1"}
	for _, tc := range []struct {
		name     string
		handoffs bool
		req      *pegadv1.EndHandoffRequest
		code     codes.Code
		ended    bool
		calls    int
	}{
		{"live", true, &pegadv1.EndHandoffRequest{Requester: me, Token: "live"}, codes.OK, true, 1},
		{"none live", true, &pegadv1.EndHandoffRequest{Requester: me, Token: "gone"}, codes.OK, false, 1},
		{"no requester", true, &pegadv1.EndHandoffRequest{Token: "live"}, codes.InvalidArgument, false, 0},
		{"token too long", true, &pegadv1.EndHandoffRequest{Requester: me, Token: strings.Repeat("a", maxHandoffToken+1)},
			codes.InvalidArgument, false, 0},
		{"no handoffs here", false, &pegadv1.EndHandoffRequest{Requester: me, Token: "live"}, codes.Unavailable, false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fh := &fakeHandoffs{}
			e := newEnv(t, func(o *Options) {
				if tc.handoffs {
					o.Handoffs = fh
				}
			})
			resp, err := e.svc.EndHandoff(context.Background(), tc.req)
			if status.Code(err) != tc.code || resp.GetEnded() != tc.ended {
				t.Fatalf("EndHandoff = %v, %v; want %v, ended %v", resp, err, tc.code, tc.ended)
			}
			if len(fh.done) != tc.calls || (tc.calls > 0 && fh.done[0] != tc.req.GetToken()) {
				t.Fatalf("Done calls %q, want %d with %q", fh.done, tc.calls, tc.req.GetToken())
			}
		})
	}
}
