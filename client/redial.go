package client

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dataLink is a client's data connection across daemon restarts: the
// connection in use, dialled again by the first call after it broke or
// after the daemon closed it (a restart). It never resends a request: a
// new connection is dialled only before anything of a call was sent, so a
// call whose request was on the wire when its connection broke fails (the
// daemon may or may not have applied it) and the next call dials again.
// Writers, Readers and spares stay on the connection that took them (their
// lease ids mean nothing on another one) and end with it.
type dataLink struct {
	path string

	mu         sync.Mutex  // guards everything below; held while dialling
	cur        *dataConn   // the connection in use (possibly broken)
	retired    []*dataConn // replaced connections, unmapped at close
	closed     bool
	reconnects int
}

func newDataLink(path string, first *dataConn) *dataLink {
	return &dataLink{path: path, cur: first}
}

// current is the connection in use now, without any I/O.
func (l *dataLink) current() *dataConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cur
}

// get returns a connection a call can be sent on: the current one while
// it is alive, else a new one (ErrUnavailable while the daemon cannot be
// reached: the next call tries again). ErrClosed after close.
func (l *dataLink) get(ctx context.Context) (*dataConn, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, ErrClosed
	}
	if l.cur.alive() {
		return l.cur, nil
	}
	if l.cur.retire() {
		l.retired = append(l.retired, l.cur)
	}
	dc, err := dialData(ctx, l.path)
	if err != nil {
		return nil, fmt.Errorf("reconnect: %w", err)
	}
	l.cur = dc
	l.reconnects++
	return dc, nil
}

// close closes the current connection and unmaps every retired one.
func (l *dataLink) close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	for _, d := range l.retired {
		_ = d.close() // broken already: only the unmap is left
	}
	l.retired = nil
	return l.cur.close()
}

// alive reports whether a call could be sent on d now: not closed, not
// broken, and not closed by the daemon meanwhile. Between calls the daemon
// sends nothing, so a socket that is readable then was closed by it (or
// sent bytes nobody asked for): d is marked broken, nothing is sent. It
// waits for a call in flight on another goroutine.
func (d *dataConn) alive() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed || d.broken != nil {
		return false
	}
	ready := d.r.Buffered() > 0
	if !ready {
		rc, err := d.c.SyscallConn()
		if err != nil {
			ready = true
		} else if cerr := rc.Control(func(fd uintptr) {
			fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN | unix.POLLPRI}}
			n, perr := unix.Poll(fds, 0)
			ready = perr != nil && perr != unix.EINTR || n > 0
		}); cerr != nil {
			ready = true
		}
	}
	if !ready {
		return true
	}
	d.broken = fmt.Errorf("%w: the daemon closed the data connection", ErrUnavailable)
	_ = d.c.Close()
	return false
}

// retire stops using d after the link dialled a new connection: every
// later call on it returns ErrUnavailable, its spare is dropped, and the
// mapping of the old pool is replaced in place by anonymous memory, so the
// old daemon's pool is freed now while slices Writers and Readers still
// hold stay addressable (they read zeros; their Release or Commit fails).
// It reports whether d was not retired before.
func (d *dataConn) retire() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.retired || d.closed {
		return false
	}
	d.retired = true
	if d.broken == nil {
		d.broken = fmt.Errorf("%w: data connection replaced by a new one", ErrUnavailable)
	}
	_ = d.c.Close()
	d.spare = nil
	if len(d.mem) > 0 {
		_, _ = unix.MmapPtr(-1, 0, unsafe.Pointer(unsafe.SliceData(d.mem)), uintptr(len(d.mem)),
			unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_FIXED|unix.MAP_NORESERVE)
	}
	return true
}
