package conn

import (
	"errors"
	"testing"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
)

// TestEndpointSecret: the tcp data-port secret survives the handshake's
// proto round trip (without it no data connection is admitted), verbs
// endpoints carry none, and a secret of the wrong length is an invalid
// handshake.
func TestEndpointSecret(t *testing.T) {
	s := &NICs{opts: NICOptions{Transport: "tcp"}}
	ep := ibv.Endpoint{QPN: 0x100, PSN: 7, Addr: "127.0.0.1:9", Secret: [16]byte{1, 2, 15: 3}}
	back, err := s.endpointFromProto(endpointToProto(ep))
	if err != nil || back != ep {
		t.Fatalf("round trip: %+v, %v; want %+v", back, err, ep)
	}
	if p := endpointToProto(ibv.Endpoint{QPN: 1}); p.Secret != nil {
		t.Fatalf("verbs endpoint carries a secret: %x", p.Secret)
	}
	_, err = s.endpointFromProto(&pegadv1.Endpoint{Qpn: 0x100, Psn: 7, Addr: "127.0.0.1:9", Secret: make([]byte, 15)})
	if !errors.Is(err, ErrInvalidHandshake) {
		t.Fatalf("15-byte secret: %v, want ErrInvalidHandshake", err)
	}
}
