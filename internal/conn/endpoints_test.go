package conn

import (
	"context"
	"errors"
	"fmt"
	"testing"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// TestMaxEndpointsAllowsConfiguredNICsTimesQPs (issue 27 item 7): a
// handshake was refused past 256 endpoints, so a requester with 5 NICs
// and the maximum qps-per-peer (320 QPs, a valid configuration) could
// never connect (the first case fails on the old code). A holder now
// accepts as many as its own NIC count × the most QPs a peer may use.
func TestMaxEndpointsAllowsConfiguredNICsTimesQPs(t *testing.T) {
	tests := []struct {
		name       string
		holderNICs int
		reqNICs    int
		wantErr    bool
	}{
		{"5 NICs x 64 QPs to a 5-NIC holder", 5, 5, false},
		{"5 NICs x 64 QPs to a 1-NIC holder", 1, 5, true},
		{"4 NICs x 64 QPs to a 1-NIC holder", 1, 4, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d := newDialers(t)
			hold := newNode(t, d, nodeOpts{id: "holder", nics: tc.holderNICs})
			req := &pegadv1.RdmaHandshakeRequest{
				Requester: &pegadv1.Requester{NodeId: "req", Incarnation: "i"}, Transport: "tcp", HandshakeId: "hs",
			}
			for n := range tc.reqNICs {
				nh := &pegadv1.NicHandshake{Nic: fmt.Sprintf("n%d", n)}
				for q := range maxQPsPerPeer {
					nh.Endpoints = append(nh.Endpoints, &pegadv1.Endpoint{Qpn: uint32(0x100 + q), Psn: 7, Addr: "127.0.0.1:9"})
				}
				req.Nics = append(req.Nics, nh)
			}
			_, err := hold.acc.Accept(context.Background(), req)
			switch {
			case tc.wantErr && !errors.Is(err, ErrInvalidHandshake):
				t.Fatalf("Accept = %v, want ErrInvalidHandshake", err)
			case !tc.wantErr && err != nil:
				t.Fatalf("Accept: %v", err)
			case !tc.wantErr:
				hold.checkQPs(t, tc.reqNICs*maxQPsPerPeer)
			}
		})
	}
}
