package holder

import (
	"context"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// FuzzPeerRPCs decodes arbitrary bytes off the peer port as the requests of
// the holder's lock RPCs and runs them: whatever arrives, the handler
// answers (never panics), a failure is a deliberate status code (never
// Internal or Unknown), a session it opened can be released by its owner,
// and every pin it took is dropped again.
func FuzzPeerRPCs(f *testing.F) {
	add := func(rpc uint8, m proto.Message) {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(rpc, b)
	}
	r := req("node", "inc")
	add(0, &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{[]byte("a"), []byte("b")}, Requester: r})
	add(0, &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{[]byte("a"), []byte("a")}, RequesterId: "legacy"})
	add(0, &pegadv1.QueryBlocksForTransferRequest{Namespace: "", Hashes: [][]byte{{}}, Requester: &pegadv1.Requester{}})
	add(1, &pegadv1.ReleaseTransferLockRequest{SessionId: "00112233445566778899aabbccddeeff", Requester: r})
	add(1, &pegadv1.ReleaseTransferLockRequest{SessionId: "zz", RequesterId: "node"})
	add(2, &pegadv1.RenewTransferLockRequest{SessionId: "00112233445566778899aabbccddeeff", Requester: r})
	f.Add(uint8(0), []byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f})

	f.Fuzz(func(t *testing.T, rpc uint8, data []byte) {
		e := newEnv(t, nil, "a", "b", "c")
		ctx := context.Background()
		var err error
		switch rpc % 3 {
		case 0:
			var in pegadv1.QueryBlocksForTransferRequest
			if proto.Unmarshal(data, &in) != nil {
				return
			}
			var resp *pegadv1.QueryBlocksForTransferResponse
			resp, err = e.svc.QueryBlocksForTransfer(ctx, &in)
			if err == nil && resp.GetSessionId() != "" {
				owner := in.GetRequester().GetNodeId()
				if owner == "" {
					owner = in.GetRequesterId()
				}
				rel, rerr := e.svc.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{
					SessionId: resp.GetSessionId(), Requester: &pegadv1.Requester{NodeId: owner, Incarnation: in.GetRequester().GetIncarnation()},
				})
				if rerr != nil || !rel.GetWasLive() || int(rel.GetReleasedBlocks()) != len(resp.GetBlocks()) {
					t.Fatalf("owner's release of a fresh session: %v, %v (session had %d blocks)", rel, rerr, len(resp.GetBlocks()))
				}
			}
		case 1:
			var in pegadv1.ReleaseTransferLockRequest
			if proto.Unmarshal(data, &in) != nil {
				return
			}
			_, err = e.svc.ReleaseTransferLock(ctx, &in)
		case 2:
			var in pegadv1.RenewTransferLockRequest
			if proto.Unmarshal(data, &in) != nil {
				return
			}
			_, err = e.svc.RenewTransferLock(ctx, &in)
		}
		if code := status.Code(err); code == codes.Internal || code == codes.Unknown {
			t.Fatalf("rpc %d answered %v: %v", rpc%3, code, err)
		}
		if n := e.svc.locks.Len(); n != 0 {
			t.Fatalf("%d sessions left open", n)
		}
		if n := e.pins.outstanding(); n != 0 {
			t.Fatalf("%d pins outstanding", n)
		}
	})
}
