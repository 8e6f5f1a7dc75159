package localapi

import (
	"errors"
	"io"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/store"
)

// PutBlock receives a header, then the block's bytes in order, and stores
// the block. Nothing is stored unless every byte arrived and fit.
//
// The pool is not touched until the last byte has arrived: the data is
// held in memory as it comes (bounded by the put buffer, taken chunk by
// chunk), and only then is room made in the pool (evicting if need be)
// and the block copied in. So a client that stalls after its header
// evicts nothing, and one that goes quiet for the idle timeout is cut off
// (DeadlineExceeded) and its buffered bytes given back.
func (l *Local) PutBlock(stream pegadv1.LocalService_PutBlockServer) error {
	if !l.poolUsers.enter() {
		return errShuttingDown
	}
	defer l.poolUsers.leave()
	r := newIdleRecv(stream, l.idle)
	defer r.stop()

	first, err := r.recv()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return invalidf("empty PutBlock stream: the first message must be a header")
		}
		return err
	}
	h := first.GetHeader()
	if h == nil {
		return invalidf("the first PutBlock message must be a header")
	}
	// The key is checked here, before any byte is taken, and only here:
	// the store trusts a CheckedKey.
	key, err := store.CheckKey(store.Key{Namespace: h.GetNamespace(), Hash: string(h.GetHash())})
	if err != nil {
		return invalidf("%v", err)
	}
	sizes, total, err := slotSizes(h.GetSlots())
	if err != nil {
		return err
	}
	if ps := l.store.Pool().Size(); total > ps {
		return statusf(codes.ResourceExhausted, pegaderr.NoSpace, "block of %d bytes does not fit in a pool of %d bytes", total, ps)
	}
	if total > l.putBuf.size {
		return statusf(codes.ResourceExhausted, pegaderr.Limit, "block of %d bytes is larger than the put buffer of %d bytes", total, l.putBuf.size)
	}
	data, held, err := r.receiveAll(total, l.putBuf)
	defer l.putBuf.give(held)
	if err != nil {
		return err
	}
	created, err := l.store.PutChecked(key, sizes, func(buf []byte) error {
		for _, d := range data {
			buf = buf[copy(buf, d):]
		}
		return nil
	})
	if err != nil {
		if errors.Is(err, store.ErrNoSpace) {
			return statusf(codes.ResourceExhausted, pegaderr.NoSpace, "block of %d bytes does not fit: %v (nothing stored)", total, err)
		}
		return toStatus(err)
	}
	l.log.Debug().Str("namespace", h.GetNamespace()).Hex("hash", h.GetHash()).Uint64("bytes", total).
		Bool("created", created).Msg("block put")
	return stream.SendAndClose(&pegadv1.PutBlockResponse{Bytes: total, Created: created})
}

// slotSizes validates the header's slots and sums them.
func slotSizes(slots []*pegadv1.SlotSize) ([]store.SlotSize, uint64, error) {
	if len(slots) == 0 {
		return nil, 0, invalidf("block has no slots")
	}
	if len(slots) > store.MaxSlots {
		return nil, 0, invalidf("block has %d slots, more than %d", len(slots), store.MaxSlots)
	}
	out := make([]store.SlotSize, len(slots))
	var total uint64
	for i, s := range slots {
		if s.GetKSize() == 0 {
			return nil, 0, invalidf("slot %d has an empty K segment", i)
		}
		if s.GetKSize() > store.MaxBlockLen || s.GetVSize() > store.MaxBlockLen {
			return nil, 0, invalidf("slot %d is larger than %d bytes", i, uint64(store.MaxBlockLen))
		}
		total += s.GetKSize() + s.GetVSize()
		if total > store.MaxBlockLen {
			return nil, 0, invalidf("block is larger than %d bytes", uint64(store.MaxBlockLen))
		}
		out[i] = store.SlotSize{KSize: s.GetKSize(), VSize: s.GetVSize()}
	}
	return out, total, nil
}

// budget bounds the bytes PutBlock streams hold in memory. Bytes are
// taken as they arrive and never waited for: a stream that would pass the
// bound fails at once (ResourceExhausted), so streams cannot deadlock
// each holding part of it.
type budget struct {
	size uint64     // immutable
	mu   sync.Mutex // guards free
	free uint64
}

func (b *budget) take(n uint64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.free {
		return false
	}
	b.free -= n
	return true
}

func (b *budget) give(n uint64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.free += n
	b.mu.Unlock()
}

type recvd struct {
	m   *pegadv1.PutBlockRequest
	err error
}

// idleRecv receives a PutBlock stream with an idle timeout. gRPC's Recv
// cannot be interrupted by the handler, so one goroutine, owned by the
// handler, runs each Recv the handler asks for; on timeout the handler
// returns, which ends the stream's context and so the pending Recv, and
// the goroutine exits (stop).
type idleRecv struct {
	stream pegadv1.LocalService_PutBlockServer
	idle   time.Duration
	want   chan struct{}
	msgs   chan recvd
	done   chan struct{}
}

func newIdleRecv(stream pegadv1.LocalService_PutBlockServer, idle time.Duration) *idleRecv {
	r := &idleRecv{stream: stream, idle: idle, want: make(chan struct{}), msgs: make(chan recvd), done: make(chan struct{})}
	go r.loop()
	return r
}

func (r *idleRecv) loop() {
	for {
		select {
		case <-r.want:
		case <-r.done:
			return
		}
		m, err := r.stream.Recv()
		select {
		case r.msgs <- recvd{m, err}:
		case <-r.done:
			return
		}
	}
}

func (r *idleRecv) stop() { close(r.done) }

// recv returns the next message, or DeadlineExceeded after the idle
// timeout with nothing received.
func (r *idleRecv) recv() (*pegadv1.PutBlockRequest, error) {
	t := time.NewTimer(r.idle)
	defer t.Stop()
	select {
	case r.want <- struct{}{}:
	case <-t.C:
		return nil, r.idleErr()
	}
	select {
	case x := <-r.msgs:
		return x.m, x.err
	case <-t.C:
		return nil, r.idleErr()
	}
}

func (r *idleRecv) idleErr() error {
	return statusf(codes.DeadlineExceeded, pegaderr.Deadline, "PutBlock stream sent nothing for %s: nothing stored", r.idle)
}

// receiveAll reads data messages until EOF; they must add up to exactly
// total bytes. Each message's bytes are taken from buf as they arrive;
// held is what was taken (to give back), also on error. Errors are gRPC
// statuses.
func (r *idleRecv) receiveAll(total uint64, buf *budget) (data [][]byte, held uint64, err error) {
	for {
		m, err := r.recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, held, err
		}
		if m.GetHeader() != nil {
			return nil, held, invalidf("a second header in a PutBlock stream")
		}
		d := m.GetData()
		if len(d) > MaxChunk {
			return nil, held, invalidf("data message of %d bytes, more than %d", len(d), MaxChunk)
		}
		if held+uint64(len(d)) > total {
			return nil, held, invalidf("more data than the header's %d bytes", total)
		}
		if !buf.take(uint64(len(d))) {
			return nil, held, statusf(codes.ResourceExhausted, pegaderr.Limit,
				"put buffer full (%d bytes): too many PutBlock bytes in flight; retry", buf.size)
		}
		held += uint64(len(d))
		if len(d) > 0 {
			data = append(data, d) // the message's own copy (gRPC does not reuse it)
		}
	}
	if held != total {
		return nil, held, invalidf("short data: got %d of the header's %d bytes", held, total)
	}
	return data, held, nil
}
