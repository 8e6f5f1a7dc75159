package tcp

import (
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/pegaflow/pegad/internal/ibv"
)

// The requester side's reader: responses of a QP's data connection, READ
// payloads landing straight in local memory.

// progressReader stamps q.lastRecv whenever a read returns bytes.
type progressReader struct {
	r io.Reader
	q *qp
}

func (p progressReader) Read(b []byte) (int, error) {
	n, err := p.r.Read(b)
	if n > 0 {
		p.q.lastRecv.Store(int64(time.Since(clockBase)))
	}
	return n, err
}

// reader applies the responses arriving on c; see qp. A READ response's
// payload is read from the socket straight into the WR's local memory
// (landLocked); the rest of a frame is read into a small header buffer.
func (q *qp) reader(c *dconn) {
	defer q.wg.Done()
	defer q.dev.untrackConn(c)
	defer c.Close()
	var r io.Reader = progressReader{r: c.c, q: q}
	var head [prefixLen + fixedReadResp]byte
	for {
		m, n, err := readRespHead(r, &head)
		q.mu.Lock()
		// Under Faults.AsyncFlush an ERROR QP whose flush is pending still
		// applies responses (a real HCA may DMA them until it flushes).
		if !q.liveConnLocked(c) {
			q.mu.Unlock()
			return
		}
		if err == nil {
			err = q.applyLocked(m, n, r)
			if !q.liveConnLocked(c) { // failed while the payload landed
				q.mu.Unlock()
				return
			}
		}
		if err != nil {
			q.conn = nil
			if q.flushPending {
				q.failLocked(nil, ibv.WCWRFlushErr)
			} else if q.inFlightLocked() {
				cause := lostCause(c, err)
				q.log.Warn().Err(cause).Msg("data connection lost with work in flight")
				q.failCauseLocked(q.firstPendingLocked(), ibv.WCRetryExcErr, cause)
			} else {
				select { // a WR posted meanwhile needs a new dial
				case q.kick <- struct{}{}:
				default:
				}
			}
			q.mu.Unlock()
			return
		}
		q.mu.Unlock()
		q.touch()
	}
}

// liveConnLocked reports whether c is still the QP's data connection and
// the QP still takes responses.
func (q *qp) liveConnLocked(c *dconn) bool {
	return q.conn == c && (q.state == ibv.QPSRTS || q.flushPending)
}

// landLocked reads the n payload bytes of a READ response from r straight
// into w's local memory at w.got. It drops mu for the read (ToError and
// the sender's retry budget must not wait for the network) and marks the
// QP landing meanwhile: failLocked closes the connection, which ends the
// read, and waits until landing is over before it delivers any flush
// completion or returns, so no byte lands after ToError or Destroy
// returned, or after a flush completion was polled. The region is pinned
// for the read, so Dereg waits for it too.
func (q *qp) landLocked(w *wqe, n int, r io.Reader) error {
	lm := q.dev.lookupKey(w.wr.LKey, true)
	dst, ok := lm.pin(q.pd, ibv.AccessLocalWrite, w.wr.LocalAddr+uint64(w.got), uint64(n))
	if !ok {
		q.failLocked(w, ibv.WCLocProtErr)
		return nil
	}
	q.landing = true
	q.mu.Unlock()
	_, err := io.ReadFull(r, dst)
	lm.unpin()
	q.mu.Lock()
	q.landing = false
	q.landed.Broadcast()
	return unexpectedEOF(err)
}

// applyLocked applies one response frame, whose READ payload (n bytes)
// is still in r. As on an RC QP, responses come in request order: anything
// but a response to the oldest WR in flight is a bad response. It returns
// an error only when reading the payload failed (the connection is lost).
func (q *qp) applyLocked(m msg, n int, r io.Reader) error {
	if q.sendIdx == 0 || q.sq[0].seq != m.seq || q.sq[0].done {
		q.failLocked(q.firstPendingLocked(), ibv.WCBadRespErr)
		return nil
	}
	w := q.sq[0]
	q.lastProgress = time.Now()
	nakStatus := func(st byte) ibv.WCStatus {
		if st == stRemAccess {
			return ibv.WCRemAccessErr
		}
		return ibv.WCRemInvReqErr
	}
	switch {
	case m.typ == tReadResp && w.wr.Op == ibv.OpRDMARead:
		if m.status != stOK {
			q.failLocked(w, nakStatus(m.status))
			return nil
		}
		if m.offset != w.got || uint64(w.got)+uint64(n) > uint64(w.wr.Length) {
			q.failLocked(w, ibv.WCBadRespErr)
			return nil
		}
		if n > 0 {
			if err := q.landLocked(w, n, r); err != nil {
				return err
			}
			if w.done { // failed meanwhile (ToError, Destroy, Dereg)
				return nil
			}
			q.lastProgress = time.Now()
		}
		w.got += uint32(n)
		if w.got < w.wr.Length {
			return nil
		}
		q.rdOut--
	case m.typ == tWriteAck && w.wr.Op == ibv.OpRDMAWrite:
		if m.status != stOK {
			q.failLocked(w, nakStatus(m.status))
			return nil
		}
	default:
		q.failLocked(w, ibv.WCBadRespErr)
		return nil
	}
	w.done, w.status = true, ibv.WCSuccess
	q.completeLocked()
	// Wake the sender only when a WR waits to be sent (a READ slot or the
	// queue freed up); its own timer watches the retry budget meanwhile,
	// so a completion with nothing behind it costs no goroutine switch.
	if q.sendIdx < len(q.sq) {
		select {
		case q.kick <- struct{}{}:
		default:
		}
	}
	return nil
}

// lostCause is what made a data connection with work in flight fail, for
// the failed completion's Cause: the request write error that closed it
// (sendFailed), else the read error, marked ibv.ErrPeerClosed when the
// peer closed (EOF) or reset (ECONNRESET, EPIPE) the connection. A peer
// daemon stopped mid-read then says so, not just RETRY_EXC_ERR.
func lostCause(c *dconn, err error) error {
	if p := c.writeErr.Load(); p != nil {
		err = *p
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return fmt.Errorf("%w: %w", ibv.ErrPeerClosed, err)
	}
	return err
}
