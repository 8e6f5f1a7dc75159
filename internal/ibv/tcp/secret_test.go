package tcp

import (
	"bytes"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/ibv/ibvtest"
	"github.com/pegaflow/pegad/internal/metrics"
)

// TestDataPortNeedsHandshakeSecret (issue 10 item 4): a client that knows
// the holder QP's QPN, the endpoint it is connected to (QPN, PSN, address)
// and a valid rkey, but not the secret of the handshake answer, reads
// nothing: its hello is answered as if the QP did not exist, the READ it
// sent right behind the hello is never served, and the refusal is counted.
// The same bytes with the secret read the memory (the test's control).
func TestDataPortNeedsHandshakeSecret(t *testing.T) {
	d, met := newGatedDevice(t, 1024, 1024)
	holder := ibvtest.NewSide(t, d, ibvtest.DefaultCap())
	mem, mr := ibvtest.Region(t, holder, 4096, accRead, 7)
	remote := ibv.Endpoint{QPN: 77, PSN: 5, Addr: "127.0.0.1:1"} // never dialed
	if err := holder.QP.Connect(remote, ibv.DefaultConnectAttr()); err != nil {
		t.Fatal(err)
	}
	secret := holder.QP.Endpoint().Secret
	if secret == ([16]byte{}) {
		t.Fatal("QP has no secret")
	}
	// try sends a hello with secret and a READ of the whole region in one
	// write, as a client that does not wait for the ack would, and returns
	// the ack and what came back for the READ.
	try := func(secret [16]byte) (ack byte, data []byte, err error) {
		c, err := net.Dial("tcp", d.Info().Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		out := appendHello(nil, remote.QPN, holder.QP.QPN(), remote.PSN, ibv.GID{}, secret, remote.Addr)
		out = appendReadReq(out, 1, mr.Addr(), mr.RKey(), uint32(len(mem)))
		if _, err := c.Write(out); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 2*len(mem))
		m, err := readFrame(c, buf)
		if err != nil {
			t.Fatalf("hello ack: %v", err)
		}
		ack = m.status
		m, err = readFrame(c, buf)
		if err != nil {
			return ack, nil, err
		}
		return ack, append([]byte(nil), m.payload...), nil
	}

	flipped := secret
	flipped[15] ^= 1
	for _, bad := range [][16]byte{{}, flipped} {
		ack, data, err := try(bad)
		if ack != stNoQP || data != nil || !(errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || isReset(err)) {
			t.Fatalf("secret %x: ack %d, %d bytes read, err %v; want ack %d (no such QP), nothing, connection closed",
				bad, ack, len(data), err, stNoQP)
		}
	}
	waitFor(t, "refusals counted", 10*time.Second, func() bool {
		return metrics.Value(met.TCPDataRefused.WithLabelValues(refusedBadSecret)) == 2
	})
	if open, _, _ := holder.QP.(*qp).DataActivity(); open != 0 {
		t.Fatalf("%d data connections admitted without the secret", open)
	}

	ack, data, err := try(secret)
	if ack != stOK || err != nil || !bytes.Equal(data, mem) {
		t.Fatalf("with the secret: ack %d, err %v, %d bytes, equal %v", ack, err, len(data), bytes.Equal(data, mem))
	}
}
