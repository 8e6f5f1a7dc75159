package client

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pegaflow/pegad/api/localwire"
)

// dataConn is the connection to the daemon's data socket and the client's
// mapping of the pool's memfd. One request is in flight at a time.
type dataConn struct {
	mem          []byte        // the mapped pool; immutable until close
	leaseTimeout time.Duration // immutable
	version      uint32        // the protocol version the daemon answered; immutable
	parts        []PoolPart    // the pool's NUMA parts (version 4; nil before); immutable

	mu      sync.Mutex // guards everything below and serializes requests
	c       *net.UnixConn
	r       *bufio.Reader
	seq     uint32
	out     []byte
	hdr     [localwire.HeaderLen]byte
	body    []byte
	broken  error // set once the connection failed; every later call returns it
	closed  bool
	retired bool   // replaced by a new connection (redial.go); its mapping is anonymous memory now
	spare   *spare // room reserved for the next Put (put.go); nil: none
}

// errRefusedHello: the daemon answered HELLO with a frame-level refusal
// (a daemon older than this package refuses the newer version).
var errRefusedHello = errors.New("daemon refused hello")

// dialData connects to path, says hello and maps the memfd it receives. A
// daemon that refuses this package's protocol version is dialled again
// with the next older one, down to the oldest (the lookups need 3; before
// 2, Put takes two round trips).
func dialData(ctx context.Context, path string) (*dataConn, error) {
	dc, err := dialVersion(ctx, path, localwire.Version)
	// One version down at a time: a version-2 daemon keeps PUT.
	for v := uint32(localwire.Version) - 1; errors.Is(err, errRefusedHello) && v >= localwire.MinVersion; v-- {
		dc, err = dialVersion(ctx, path, v)
	}
	return dc, err
}

func dialVersion(ctx context.Context, path string, version uint32) (*dataConn, error) {
	var d net.Dialer
	nc, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, &SocketError{Socket: path, Err: err}
	}
	c := nc.(*net.UnixConn)
	dc := &dataConn{c: c, r: bufio.NewReaderSize(c, 64<<10)}
	if err := dc.hello(ctx, version); err != nil {
		c.Close()
		return nil, err
	}
	return dc, nil
}

func (d *dataConn) hello(ctx context.Context, version uint32) error {
	if dl, ok := ctx.Deadline(); ok {
		_ = d.c.SetDeadline(dl)
		defer func() { _ = d.c.SetDeadline(time.Time{}) }()
	}
	b := localwire.Begin(nil, localwire.OpHello, localwire.StatusOK, 0, 0)
	b, _ = localwire.Finish(localwire.AppendHello(b, localwire.Hello{Version: version}))
	if _, err := d.c.Write(b); err != nil {
		return fmt.Errorf("%w: hello: %w", ErrUnavailable, err)
	}
	// The fd rides on the reply's first bytes: read them with recvmsg
	// before anything buffers the stream.
	buf := make([]byte, localwire.HeaderLen+64)
	oob := make([]byte, unix.CmsgSpace(4))
	n, oobn, _, _, err := d.c.ReadMsgUnix(buf, oob)
	if err != nil {
		return fmt.Errorf("%w: hello: %w", ErrUnavailable, err)
	}
	fd := -1
	if msgs, err := unix.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for _, m := range msgs {
			if fds, err := unix.ParseUnixRights(&m); err == nil {
				for _, f := range fds {
					if fd < 0 {
						fd = f
					} else {
						unix.Close(f)
					}
				}
			}
		}
	}
	if fd >= 0 {
		defer unix.Close(fd) // the mapping keeps the memory; the fd is not needed after mmap
	}
	d.r = bufio.NewReaderSize(io.MultiReader(bytes.NewReader(buf[:n]), d.c), 64<<10)
	h, body, err := d.readFrame()
	if err != nil {
		return fmt.Errorf("%w: hello: %w", ErrProtocol, err)
	}
	if h.Status != localwire.StatusOK {
		if fd >= 0 {
			return fmt.Errorf("%w: hello refused, yet with a memfd: %s", ErrProtocol, body)
		}
		return fmt.Errorf("%w: %w (version %d): %s", ErrProtocol, errRefusedHello, version, body)
	}
	rep, err := localwire.DecodeHelloReply(body)
	if err != nil {
		return fmt.Errorf("%w: hello: %w", ErrProtocol, err)
	}
	if h.Op != localwire.OpHello || rep.Version != version {
		return fmt.Errorf("%w: hello answered with %v version %d", ErrProtocol, h.Op, rep.Version)
	}
	if fd < 0 {
		return fmt.Errorf("%w: hello carried no memfd", ErrProtocol)
	}
	if rep.PoolSize == 0 || rep.PoolSize > uint64(^uint(0)>>1) {
		return fmt.Errorf("%w: pool of %d bytes", ErrProtocol, rep.PoolSize)
	}
	mem, err := unix.Mmap(fd, 0, int(rep.PoolSize), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return fmt.Errorf("map the pool (%d bytes): %w", rep.PoolSize, err)
	}
	d.mem = mem
	d.version = version
	d.parts = poolParts(rep.Parts)
	d.leaseTimeout = time.Duration(rep.LeaseTimeout) * time.Millisecond
	return nil
}

// readFrame reads one frame; body is valid until the next read.
func (d *dataConn) readFrame() (localwire.Header, []byte, error) {
	if _, err := io.ReadFull(d.r, d.hdr[:]); err != nil {
		return localwire.Header{}, nil, err
	}
	h, err := localwire.ParseHeader(d.hdr[:])
	if err != nil {
		return h, nil, err
	}
	n := h.BodyLen()
	if cap(d.body) < n {
		d.body = make([]byte, n)
	}
	d.body = d.body[:n]
	if _, err := io.ReadFull(d.r, d.body); err != nil {
		return h, nil, err
	}
	return h, d.body, nil
}

// call sends one request of count items (appended to the frame by enc) and
// returns its decoded results. Any failure of the connection itself breaks
// it for good: the daemon then ends its leases, and the client's next call
// dials a new connection (dataLink).
func (d *dataConn) call(ctx context.Context, op localwire.Op, count int, enc func(b []byte) []byte) ([]localwire.Result, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if d.broken != nil {
		return nil, d.broken
	}
	res, err := d.callLocked(ctx, op, count, enc)
	// Only a frame too large to send leaves the connection as it was.
	if err != nil && !errors.Is(err, ErrInvalid) {
		d.broken = fmt.Errorf("%w: data connection broken by an earlier failure: %w", ErrUnavailable, err)
		d.c.Close()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("%v: %w (data connection closed)", op, ctxErr)
		}
		return nil, err
	}
	return res, nil
}

func (d *dataConn) callLocked(ctx context.Context, op localwire.Op, count int, enc func(b []byte) []byte) ([]localwire.Result, error) {
	d.seq++
	b := enc(localwire.Begin(d.out, op, localwire.StatusOK, count, d.seq))
	b, err := localwire.Finish(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	d.out = b
	// Every call sets its own deadline (none: the zero time), and a
	// cancel moves it into the past. Deferred in this order: wait for a
	// cancel callback that already started, then clear the deadline, so a
	// cancel racing the end of a successful call never leaves a past
	// deadline that would fail the next call and break the connection.
	dl, _ := ctx.Deadline()
	_ = d.c.SetDeadline(dl)
	defer func() { _ = d.c.SetDeadline(time.Time{}) }()
	if ctx.Done() != nil {
		fired := make(chan struct{})
		stop := context.AfterFunc(ctx, func() {
			_ = d.c.SetDeadline(time.Unix(1, 0))
			close(fired)
		})
		defer func() {
			if !stop() {
				<-fired
			}
		}()
	}
	if _, err := d.c.Write(b); err != nil {
		return nil, fmt.Errorf("%w: %v: %w", ErrUnavailable, op, err)
	}
	h, body, err := d.readFrame()
	if err != nil {
		if errors.Is(err, localwire.ErrMalformed) {
			return nil, fmt.Errorf("%w: %v: %w", ErrProtocol, op, err)
		}
		return nil, fmt.Errorf("%w: %v: %w", ErrUnavailable, op, err)
	}
	if h.Status != localwire.StatusOK {
		return nil, fmt.Errorf("%w: daemon refused %v: %v: %s", ErrProtocol, op, h.Status, body)
	}
	if h.Op != op || h.Seq != d.seq || int(h.Count) != count {
		return nil, fmt.Errorf("%w: answer %v seq %d count %d to %v seq %d count %d",
			ErrProtocol, h.Op, h.Seq, h.Count, op, d.seq, count)
	}
	res, err := localwire.DecodeResults(op, body, count)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrProtocol, err)
	}
	return res, nil
}

// slice is [off, off+n) of the mapped pool; false when outside it.
func (d *dataConn) slice(off, n uint64) ([]byte, bool) {
	size := uint64(len(d.mem))
	if off > size || n > size-off {
		return nil, false
	}
	return d.mem[off : off+n : off+n], true
}

// close closes the connection (the daemon ends its leases) and unmaps the
// pool.
func (d *dataConn) close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	if sp := d.spare; sp != nil && d.broken == nil {
		// Give the spare back before closing, so that when Close returns
		// the daemon's pool no longer counts it (a tool that puts and
		// exits leaves exactly its blocks). Best effort, bounded by a
		// second: the close below ends it anyway.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, _ = d.callLocked(ctx, localwire.OpAbort, 1, func(b []byte) []byte { return localwire.AppendID(b, sp.id) })
		cancel()
	}
	d.spare = nil
	err := d.c.Close()
	if d.broken != nil {
		err = nil // closed already when it broke
	}
	if uerr := unix.Munmap(d.mem); uerr != nil && err == nil {
		err = uerr
	}
	return err
}
