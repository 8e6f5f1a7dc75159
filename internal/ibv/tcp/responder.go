package tcp

import (
	"crypto/subtle"
	"errors"
	"net"
	"os"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
	"github.com/pegaflow/pegad/internal/netgate"
)

// acceptLoop accepts data connections until the listener is closed; each
// connection gets one responder goroutine (serve), counted by d.wg.
func (d *Device) acceptLoop() {
	defer d.wg.Done()
	for {
		raw, err := d.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			d.log.Warn().Err(err).Msg("accept data connection")
			select {
			case <-d.done:
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		c := newDconn(raw)
		if !d.trackConn(c) {
			c.Close()
			return
		}
		ge, victim, why := d.gate.Enter(c, netgate.SourceOf(c.c))
		if victim != nil {
			v := victim.Value()
			d.refused(why)
			d.log.Debug().Str("peer", v.c.RemoteAddr().String()).Str("reason", why).Msg("data connection dropped before its hello")
			v.Close()
		}
		d.wg.Add(1)
		go d.serve(c, ge)
	}
}

// refused counts a data connection dropped before or at its hello.
func (d *Device) refused(reason string) {
	if d.met != nil {
		d.met.TCPDataRefused.WithLabelValues(reason).Inc()
	}
}

// serve is the responder of one accepted connection: it validates the hello
// against the target QP, then serves READ and WRITE requests straight from
// registered memory until the connection closes (peer gone, CutConnections,
// the target QP leaving RTR/RTS, or a requester that takes no byte of a
// response for the QP's retry budget).
//
// Before the hello the connection holds only a hello-sized buffer, for at
// most helloTimeout, and counts against the device's helloGate; frame
// buffers are taken only after a valid hello.
func (d *Device) serve(c *dconn, ge *gateEntry) {
	defer d.wg.Done()
	defer d.untrackConn(c)
	defer c.Close()

	_ = c.c.SetReadDeadline(time.Now().Add(helloTimeout))
	m, err := readHello(c.c)
	if !d.gate.Leave(ge) {
		return // evicted by the gate (and counted there)
	}
	if err != nil {
		reason := refusedBadHello
		if errors.Is(err, os.ErrDeadlineExceeded) {
			reason = refusedHelloWait
		}
		d.refused(reason)
		d.log.Debug().Err(err).Str("peer", c.c.RemoteAddr().String()).Msg("data connection without hello")
		return
	}
	q, stall, st := d.admit(c, m)
	ack, reason := st, refusedRejected
	if st == stBadSecret {
		ack, reason = stNoQP, refusedBadSecret
	}
	if err := c.write(appendHelloAck(nil, ack), nil, helloTimeout); err != nil || st != stOK {
		if st != stOK {
			d.refused(reason)
			d.log.Debug().Str("peer", m.addr).Uint32("qpn", m.dstQPN).Uint32("remote_qpn", m.srcQPN).
				Uint8("status", st).Msg("hello rejected")
		}
		if q != nil {
			q.forgetRespConn(c)
		}
		return
	}
	defer q.forgetRespConn(c)
	_ = c.c.SetReadDeadline(time.Time{})

	// Idle between requests is fine (a live requester keeps its
	// connection); a frame begun must go on arriving: a requester that
	// stops mid-frame for the retry budget is dropped, with the frame
	// buffer it made this side take.
	sr := &stallReader{c: c.c, stall: stall}
	fr := frameReader{r: sr, inFrame: sr.arm}
	defer fr.release()
	r := responder{d: d, q: q, c: c, hdr: make([]byte, 0, 64), stall: stall}
	for {
		m, err := fr.next()
		if err != nil {
			return
		}
		q.touch()
		f := d.currentFaults()
		if f.DropResponses || r.naked {
			continue
		}
		switch m.typ {
		case tReadReq:
			if f.ResponseDelay > 0 && !r.sleep(f.ResponseDelay) {
				return
			}
			err = r.read(m)
		case tWriteReq:
			err = r.write(m)
		default:
			d.log.Debug().Uint8("type", m.typ).Msg("unexpected frame on responder connection")
			return
		}
		if err != nil {
			return
		}
	}
}

// admit checks a hello against the target QP: it must exist on this device,
// the hello must carry its secret (Endpoint.Secret, issued in the
// handshake), and it must be in RTR or RTS and connected to exactly the
// endpoint saying hello (QPN, PSN and device address). On success the connection is registered
// with the QP so that ERROR and Destroy close it. stall is how long the
// responder waits for the requester to take a byte of a response: the
// QP's retry budget.
func (d *Device) admit(c *dconn, m msg) (q *qp, stall time.Duration, st byte) {
	d.mu.Lock()
	q = d.qps[m.dstQPN]
	d.mu.Unlock()
	if q == nil {
		return nil, 0, stNoQP
	}
	// The secret came only in the handshake answer: knowing the QPN, the
	// PSN and the address is not enough. Checked first, in constant time.
	if subtle.ConstantTimeCompare(q.secret[:], m.secret[:]) != 1 {
		return nil, 0, stBadSecret
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.destroyed || (q.state != ibv.QPSRTR && q.state != ibv.QPSRTS) {
		return nil, 0, stBadState
	}
	if q.remote.QPN != m.srcQPN || q.remote.PSN != m.srcPSN || q.remote.Addr != m.addr {
		return nil, 0, stMismatch
	}
	q.respConns[c] = struct{}{}
	q.used.Store(true)
	q.touch()
	return q, q.budget, stOK
}

// responder serves the requests of one connection; only serve's goroutine
// uses it, so it writes to the connection without a lock.
type responder struct {
	d   *Device
	q   *qp
	c   *dconn
	hdr []byte
	// stall bounds each write: a requester that takes no byte of a
	// response for this long (the QP's retry budget) is dropped.
	stall time.Duration
	// naked: a request was NAKed. Like an RC responder expecting the
	// NAKed PSN again, it then drops every later request (the requester's
	// QP is in ERROR and will close the connection), so no WRITE behind a
	// failed one lands.
	naked bool
}

func (r *responder) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-r.c.done:
		return false
	case <-r.d.done:
		return false
	}
}

// remote resolves an rkey for the responder QP's PD.
func (r *responder) mr(rkey uint32) *mr { return r.d.lookupKey(rkey, false) }

// read serves one READ request in chunks, each one writev of its header
// and the slice of registered memory (no copy), the region pinned for the
// whole request so that Dereg waits for it. The whole range is checked
// first: nothing is sent for a request that is partly out of bounds; a
// failed check sends a NAK.
func (r *responder) read(m msg) error {
	mr := r.mr(m.rkey)
	src, ok := mr.pin(r.q.pd, ibv.AccessRemoteRead, m.raddr, uint64(m.length))
	if !ok {
		r.naked = true
		return r.c.write(appendReadResp(r.hdr[:0], m.seq, stRemAccess, 0, 0), nil, r.stall)
	}
	defer mr.unpin()
	for off := uint32(0); ; {
		n := min(m.length-off, chunkSize)
		if err := r.c.write(appendReadResp(r.hdr[:0], m.seq, stOK, off, int(n)), src[off:off+n], r.stall); err != nil {
			return err
		}
		off += n
		if off >= m.length {
			return nil
		}
	}
}

// write applies one WRITE chunk and acknowledges the last one. The chunk
// is applied under the QP's lock, only while the QP is RTR/RTS: once its
// ToError or Destroy returned, no WRITE lands in its memory.
func (r *responder) write(m msg) error {
	q := r.q
	q.mu.Lock()
	if q.destroyed || (q.state != ibv.QPSRTR && q.state != ibv.QPSRTS) {
		q.mu.Unlock()
		return net.ErrClosed
	}
	ok := r.mr(m.rkey).use(r.q.pd, ibv.AccessRemoteWrite, m.raddr, uint64(m.length), func(b []byte) {
		copy(b[m.offset:], m.payload)
	})
	q.mu.Unlock()
	if !ok {
		r.naked = true
		return r.c.write(appendWriteAck(r.hdr[:0], m.seq, stRemAccess), nil, r.stall)
	}
	if uint64(m.offset)+uint64(len(m.payload)) == uint64(m.length) {
		return r.c.write(appendWriteAck(r.hdr[:0], m.seq, stOK), nil, r.stall)
	}
	return nil
}

// stallReader reads a responder's connection; while armed (inside a
// frame) each read must return within stall of the previous one.
type stallReader struct {
	c     *net.TCPConn
	stall time.Duration
	armed bool
}

func (r *stallReader) Read(b []byte) (int, error) {
	if r.armed && r.stall > 0 {
		_ = r.c.SetReadDeadline(time.Now().Add(r.stall))
	}
	return r.c.Read(b)
}

// arm starts (true) or ends (false) a frame.
func (r *stallReader) arm(on bool) {
	if r.armed && !on && r.stall > 0 {
		_ = r.c.SetReadDeadline(time.Time{})
	}
	r.armed = on
}
