// Package localdata serves pegad's local data socket (<socket>.data, see
// docs/local-protocol.md): it hands the pool's memfd to a local client with
// SCM_RIGHTS, and gives out write leases (Alloc: room in the pool the client
// writes in place, then Commit indexes it or Abort returns it) and read
// leases (Lease: a pinned block the client reads in place, until Release).
//
// It owns the connections and their leases (in an internal/lease table: a
// connection that closes ends its leases at once; the lease sweeper expires the
// rest). It must never index or pin anything except through the store, nor
// give one connection a lease id that another can use: ids are per
// connection.
package localdata

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/pegaflow/pegad/api/localwire"
	"github.com/pegaflow/pegad/internal/lease"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/netgate"
	"github.com/pegaflow/pegad/internal/store"
)

// SocketSuffix is appended to the local API's --socket to name the data
// socket next to it.
const SocketSuffix = ".data"

// SocketPath is the data socket that goes with the local API socket.
func SocketPath(apiSocket string) string { return apiSocket + SocketSuffix }

// DefaultMaxLeases bounds the live leases of one connection.
const DefaultMaxLeases = 1 << 16

const (
	// DefaultHelloTimeout bounds the wait for a new connection's HELLO.
	DefaultHelloTimeout = 10 * time.Second
	// helloLen is a HELLO body's length (u32 version).
	helloLen = 4
	// keepBuffer: request and response buffers larger than this are
	// dropped after use rather than kept for the connection's life.
	keepBuffer = 1 << 20
)

// Options configure New.
type Options struct {
	Store *store.Store
	// LeaseTimeout is how long a lease lives without Renew (the daemon uses
	// its lock-timeout, as for peer sessions).
	LeaseTimeout time.Duration
	// MaxLeases per connection; 0: DefaultMaxLeases.
	MaxLeases int
	// HelloTimeout bounds the wait for a new connection's HELLO; 0:
	// DefaultHelloTimeout.
	HelloTimeout time.Duration
	// MaxHalfOpen and MaxHalfOpenPerUID bound the connections still
	// waiting for their HELLO, in all and per client uid (SO_PEERCRED);
	// 0: netgate's defaults (512, 64). When one is reached the oldest
	// waiting connection (of that uid, else of all) is closed, not the new
	// one (internal/netgate).
	MaxHalfOpen, MaxHalfOpenPerUID int
	// Refused is told of every connection closed before its HELLO ended:
	// evicted by those limits or out of HelloTimeout (netgate's Reason*
	// strings); nil: not counted.
	Refused func(reason string)
	// MaxVersion is the newest protocol version served; 0:
	// localwire.Version. Tests set it to play an older daemon.
	MaxVersion uint32
	// Metrics registers the lease metrics; nil: none.
	Metrics prometheus.Registerer
	// Engine counts lookups and bytes per namespace; nil: a new one on
	// Metrics (none without Metrics).
	Engine *metrics.Engine
	// Locator answers LOOKUP_CLUSTER (the cluster index); nil: standalone,
	// LOOKUP_CLUSTER is refused.
	Locator Locator
	// Self is this node's id in the cluster index (LOOKUP_CLUSTER names
	// another node).
	Self string
	Log  zerolog.Logger
}

// held is what a lease holds: a write allocation (ext and layout), a
// reservation (ext without a key or layout yet: RESERVE) or a pinned
// block. Kept by value in the lease table: a lease costs one allocation.
type held struct {
	key    store.CheckedKey // a write allocation's, checked at ALLOC (a pinned block's is block.Key())
	ext    *store.Extent
	layout []store.SlotLayout // nil for a reservation
	size   uint64             // a reservation's length
	block  *store.Block
}

// kind is what a lease holds, for the ops that finish it.
type kind uint8

const (
	kindRead kind = iota
	kindWrite
	kindReserved
)

func (k kind) String() string {
	switch k {
	case kindWrite:
		return "write"
	case kindReserved:
		return "reservation"
	}
	return "read"
}

func (h held) kind() kind {
	switch {
	case h.ext == nil:
		return kindRead
	case h.layout == nil:
		return kindReserved
	}
	return kindWrite
}

// Server is the data socket's server. Safe for concurrent use.
type Server struct {
	store  *store.Store         // immutable
	leases *lease.Table[held]   // immutable pointer
	met    *metrics.LocalLeases // immutable; nil without Options.Metrics
	engine *metrics.Engine      // immutable; nil without Options.Metrics
	// pins are the unadopted LOOKUP_PIN pins, all owned by pinOwner (the
	// daemon); both immutable pointers.
	pins      *lease.Table[pinned]
	pinOwner  *lease.Owner[pinned]
	maxLeases int           // immutable
	locator   Locator       // immutable; nil: standalone
	self      string        // immutable
	hello     time.Duration // immutable
	maxVer    uint32        // immutable
	log       zerolog.Logger
	// halfOpen holds the connections waiting for their HELLO (immutable
	// pointer); refused counts the ones it, or the HELLO timeout, closed
	// (immutable; never nil).
	halfOpen *netgate.Gate[*net.UnixConn]
	refused  func(reason string)
	// nodes are the NUMA nodes of the pool's parts (immutable); fallback
	// rate-limits the warning of an ALLOC_ON placed off its node.
	nodes    []int
	fallback fallbackLog
	// insert is store.InsertChecked (immutable); tests make it fail after
	// a lease was taken, which the checks before make a daemon bug.
	insert func(store.CheckedKey, *store.Extent, []store.SlotLayout) (bool, error)

	mu     sync.Mutex // guards lis, conns, closed
	lis    net.Listener
	conns  map[net.Conn]struct{}
	closed bool

	wg sync.WaitGroup // connection handlers
}

// New returns a server over o.Store's pool.
func New(o Options) *Server {
	if o.MaxLeases <= 0 {
		o.MaxLeases = DefaultMaxLeases
	}
	if o.HelloTimeout <= 0 {
		o.HelloTimeout = DefaultHelloTimeout
	}
	if o.MaxVersion == 0 || o.MaxVersion > localwire.Version {
		o.MaxVersion = localwire.Version
	}
	s := &Server{store: o.Store, log: o.Log, hello: o.HelloTimeout, maxVer: o.MaxVersion, conns: make(map[net.Conn]struct{}),
		maxLeases: o.MaxLeases, locator: o.Locator, self: o.Self}
	s.insert = s.store.InsertChecked
	s.nodes = s.store.Pool().Nodes()
	s.halfOpen = netgate.New[*net.UnixConn](o.MaxHalfOpen, o.MaxHalfOpenPerUID)
	s.refused = o.Refused
	if s.refused == nil {
		s.refused = func(string) {}
	}
	s.leases = lease.New(o.LeaseTimeout, o.MaxLeases, s.end, nil)
	s.pins = lease.New(o.LeaseTimeout, o.MaxLeases, s.endPin, nil) // at most MaxLeases unadopted pins in all
	s.pinOwner = s.pins.NewOwner()
	if o.Metrics != nil {
		s.met = metrics.NewLocalLeases(o.Metrics, func() float64 { return float64(s.leases.Len()) })
		s.engine = o.Engine
		if s.engine == nil {
			s.engine = metrics.NewEngine(o.Metrics)
		}
	}
	return s
}

// Leases is the lease table, for tests (the lease sweeper runs the server's
// ExpireBefore, which also ends unadopted pins).
func (s *Server) Leases() *lease.Table[held] { return s.leases }

// end gives back what a lease held when it ends without Commit, Abort or
// Release (disconnect, expiry, shutdown).
func (s *Server) end(h held, why lease.Reason) {
	k := h.kind()
	if k == kindRead {
		s.store.Unpin([]*store.Block{h.block})
	} else {
		s.store.ReleaseExtent(h.ext)
	}
	spare := why == lease.Expired && k == kindReserved
	if s.met != nil {
		reason := why.String()
		if spare {
			reason = metrics.LocalSpareExpired // an idle client, not a stuck one
		}
		s.met.Ended.WithLabelValues(reason).Inc()
	}
	switch {
	case why != lease.Expired:
	case spare:
		// A client's spare room for its next Put, unused for a lease
		// timeout: an idle client, not a stuck one.
		s.log.Debug().Uint64("bytes", h.size).Msg("Local reservation expired unused")
	default:
		key := h.key.Key()
		if h.block != nil {
			key = h.block.Key()
		}
		s.log.Warn().Str("namespace", key.Namespace).Hex("hash", []byte(key.Hash)).Bool("write", k == kindWrite).
			Stringer("timeout", s.leases.Timeout()).Msg("Local lease expired; its client neither finished nor renewed it")
	}
}

// Serve accepts connections on l until Close; it returns nil after Close,
// also when Close came first (it then closes l at once). So a daemon that
// stops before this goroutine ran sees the clean stop it made, not an
// error to filter (no ErrClosed to branch on).
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		l.Close()
		return nil
	}
	s.lis = l
	s.mu.Unlock()
	var backoff time.Duration
	for {
		c, err := l.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("localdata: accept: %w", err)
			}
			// EMFILE during a burst of clients and the like pass: retry
			// with a growing pause, as net/http and grpc-go do, rather
			// than take the socket (and the watchdog's health) down.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.log.Warn().Err(err).Dur("retry_in", backoff).Msg("accept on the data socket failed")
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		uc, ok := c.(*net.UnixConn)
		if !ok {
			c.Close()
			continue
		}
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			c.Close()
			return nil
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		cred, ge := s.enter(uc)
		go func() {
			defer s.wg.Done()
			s.handle(uc, cred, ge)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Close stops accepting, closes every connection (ending its leases), waits
// for the handlers and ends any lease left. Idempotent.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	if s.lis != nil {
		s.lis.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	if n := s.leases.Close(); n > 0 {
		s.log.Info().Int("leases", n).Msg("Ended local leases at shutdown")
	}
	if n := s.pins.Close(); n > 0 {
		s.log.Info().Int("pins", n).Msg("Ended unadopted local pins at shutdown")
	}
	return nil
}

// conn is one client connection. Only its handler goroutine touches it.
type conn struct {
	s       *Server
	c       *net.UnixConn
	r       *bufio.Reader
	owner   *lease.Owner[held]
	slots   []localwire.SlotPlace // scratch of lease, reused
	chain   localwire.Chain       // scratch of the LOOKUPs, reused: its hashes alias body
	version uint32                // what HELLO agreed
	uid     uint32                // the client's (SO_PEERCRED); pins are adopted by the same user only
	log     zerolog.Logger
	hdr     [localwire.HeaderLen]byte
	body    []byte
	out     []byte
}

// enter admits a new connection as waiting for its HELLO, closing the
// oldest waiting one when a half-open limit is reached.
func (s *Server) enter(c *net.UnixConn) (*unix.Ucred, *netgate.Entry[*net.UnixConn]) {
	cred := netgate.PeerCred(c)
	src := netgate.Source{}
	if cred != nil {
		src = netgate.UIDSource(cred.Uid)
	}
	ge, victim, why := s.halfOpen.Enter(c, src)
	if victim != nil {
		s.refused(why)
		s.log.Debug().Str("reason", why).Msg("Local data connection dropped before its hello")
		victim.Value().Close()
	}
	return cred, ge
}

// handle serves one connection; ge is its place among the connections
// waiting for their HELLO.
func (s *Server) handle(c *net.UnixConn, cred *unix.Ucred, ge *netgate.Entry[*net.UnixConn]) {
	cn := &conn{s: s, c: c, r: bufio.NewReaderSize(c, 64<<10), owner: s.leases.NewOwner(),
		log: s.log.With().Str("remote", credString(cred)).Logger()}
	if cred == nil {
		// Without credentials the connection can adopt no pin (and its
		// own pins none but another such connection's): an impossible uid.
		cn.uid = ^uint32(0)
	} else {
		cn.uid = cred.Uid
	}
	defer func() {
		c.Close()
		if n := cn.owner.Close(); n > 0 {
			cn.log.Info().Int("leases", n).Msg("Local client went away; ended its leases")
		}
	}()
	// A client gets HelloTimeout to say hello; after that, a connection may
	// idle as long as it likes (its leases still expire).
	_ = c.SetReadDeadline(time.Now().Add(s.hello))
	err := cn.hello()
	if !s.halfOpen.Leave(ge) {
		return // evicted while waiting (and counted there)
	}
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			s.refused(netgate.ReasonTimeout)
		}
		cn.log.Debug().Err(err).Msg("Local data handshake failed")
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	for {
		h, err := cn.read()
		if err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				cn.log.Debug().Err(err).Msg("Local data connection closed")
			}
			if errors.Is(err, localwire.ErrMalformed) {
				cn.refuse(h, err)
			}
			return
		}
		if err := cn.serve(h); err != nil {
			if errors.Is(err, localwire.ErrMalformed) {
				cn.refuse(h, err)
			}
			cn.log.Debug().Err(err).Stringer("op", h.Op).Msg("Local data request refused; closing")
			return
		}
		// A big batch's buffers are not kept for the connection's life.
		if cap(cn.body) > keepBuffer {
			cn.body = nil
		}
		if cap(cn.out) > keepBuffer {
			cn.out = nil
		}
	}
}

// credString is a peer's credentials for logs.
func credString(cred *unix.Ucred) string {
	if cred == nil {
		return ""
	}
	return fmt.Sprintf("pid=%d uid=%d", cred.Pid, cred.Uid)
}

// read reads one frame; the body stays valid until the next read.
func (cn *conn) read() (localwire.Header, error) {
	h, err := cn.readHeader()
	if err != nil {
		return h, err
	}
	return h, cn.readBody(h)
}

func (cn *conn) readHeader() (localwire.Header, error) {
	if _, err := io.ReadFull(cn.r, cn.hdr[:]); err != nil {
		return localwire.Header{}, err
	}
	return localwire.ParseHeader(cn.hdr[:])
}

// readBody reads h's body into cn.body.
func (cn *conn) readBody(h localwire.Header) error {
	n := h.BodyLen()
	if cap(cn.body) < n {
		cn.body = make([]byte, n)
	}
	cn.body = cn.body[:n]
	_, err := io.ReadFull(cn.r, cn.body)
	return err
}

// refuse answers a frame that cannot be served with a frame-level status
// and a message; the connection closes after it.
func (cn *conn) refuse(h localwire.Header, err error) {
	b := localwire.Begin(cn.out, h.Op, localwire.StatusInvalid, 0, h.Seq)
	msg := err.Error()
	if len(msg) > localwire.MaxMessage {
		msg = msg[:localwire.MaxMessage]
	}
	if b, err := localwire.Finish(append(b, msg...)); err == nil {
		_ = cn.c.SetWriteDeadline(time.Now().Add(time.Second))
		_, _ = cn.c.Write(b)
	}
}

// hello answers the client's HELLO with the pool's size, the lease timeout
// and the memfd.
//
// The frame is checked before its body is read: a peer that has not said
// hello yet must not make the daemon allocate what its header announces
// (up to MaxFrame).
func (cn *conn) hello() error {
	h, err := cn.readHeader()
	if err != nil {
		if errors.Is(err, localwire.ErrMalformed) {
			cn.refuse(h, err)
		}
		return err
	}
	if h.Op != localwire.OpHello {
		err := fmt.Errorf("%w: first frame is %v, want hello", localwire.ErrMalformed, h.Op)
		cn.refuse(h, err)
		return err
	}
	if h.BodyLen() != helloLen {
		err := fmt.Errorf("%w: hello body of %d bytes, want %d", localwire.ErrMalformed, h.BodyLen(), helloLen)
		cn.refuse(h, err)
		return err
	}
	if err := cn.readBody(h); err != nil {
		return err
	}
	hello, err := localwire.DecodeHello(cn.body)
	if err == nil && (hello.Version < localwire.MinVersion || hello.Version > cn.s.maxVer) {
		err = fmt.Errorf("%w: protocol version %d, this daemon speaks %d to %d", localwire.ErrMalformed,
			hello.Version, localwire.MinVersion, cn.s.maxVer)
	}
	cn.version = hello.Version
	if err != nil {
		cn.refuse(h, err)
		return err
	}
	p := cn.s.store.Pool()
	fd := p.FD()
	if fd < 0 {
		err := errors.New("pool closed")
		cn.refuse(h, err)
		return err
	}
	b := localwire.Begin(cn.out, localwire.OpHello, localwire.StatusOK, 0, h.Seq)
	rep := localwire.HelloReply{Version: hello.Version, PoolSize: p.Size(), LeaseTimeout: uint64(cn.s.leases.Timeout().Milliseconds())}
	if hello.Version >= 4 {
		rep.Parts = cn.s.parts()
	}
	b = localwire.AppendHelloReply(b, rep)
	b, err = localwire.Finish(b)
	if err != nil {
		return err
	}
	if _, _, err := cn.c.WriteMsgUnix(b, unix.UnixRights(fd), nil); err != nil {
		return fmt.Errorf("send memfd: %w", err)
	}
	cn.out = b
	cn.log.Debug().Msg("Local data client connected")
	return nil
}

// serve answers one request frame. An error closes the connection.
func (cn *conn) serve(h localwire.Header) error {
	if h.Status != localwire.StatusOK {
		return fmt.Errorf("%w: request with status %v", localwire.ErrMalformed, h.Status)
	}
	if v := localwire.MinVersionOf(h.Op); v > cn.version {
		return fmt.Errorf("%w: %v needs protocol version %d, the connection speaks %d", localwire.ErrMalformed, h.Op, v, cn.version)
	}
	count := int(h.Count)
	b := localwire.Begin(cn.out, h.Op, localwire.StatusOK, count, h.Seq)
	switch h.Op {
	case localwire.OpAlloc:
		items, err := localwire.DecodeAllocItems(cn.body, count)
		if err != nil {
			return err
		}
		b = cn.alloc(b, items)
	case localwire.OpAllocOn:
		items, err := localwire.DecodeAllocOnItems(cn.body, count)
		if err != nil {
			return err
		}
		for i := range items {
			b = cn.allocOne(b, &items[i].AllocItem, items[i].Node)
		}
	case localwire.OpLease:
		keys, err := localwire.DecodeKeys(cn.body, count)
		if err != nil {
			return err
		}
		b = cn.lease(b, keys)
	case localwire.OpReserve:
		sizes, err := localwire.DecodeIDs(cn.body, count)
		if err != nil {
			return err
		}
		for _, n := range sizes {
			b = cn.reserveResult(b, n)
		}
	case localwire.OpPut:
		items, err := localwire.DecodePutItems(cn.body, count)
		if err != nil {
			return err
		}
		for i := range items {
			b = cn.put(b, &items[i])
		}
	case localwire.OpLookup, localwire.OpLookupPin, localwire.OpLookupCluster:
		if err := localwire.DecodeChainInto(&cn.chain, cn.body, count); err != nil {
			return err
		}
		c := cn.chain
		switch h.Op {
		case localwire.OpLookup:
			b = cn.lookup(b, c)
		case localwire.OpLookupPin:
			b = cn.lookupPin(b, c)
		default:
			b = cn.lookupCluster(b, c)
		}
	case localwire.OpAdopt, localwire.OpUnpin:
		tok, err := localwire.DecodeToken(cn.body, count)
		if err != nil {
			return err
		}
		if h.Op == localwire.OpAdopt {
			b = cn.adopt(b, tok)
		} else {
			b = cn.unpin(b, tok)
		}
	case localwire.OpCommit, localwire.OpAbort, localwire.OpRelease, localwire.OpRenew:
		ids, err := localwire.DecodeIDs(cn.body, count)
		if err != nil {
			return err
		}
		for _, id := range ids {
			b = cn.finish(b, h.Op, lease.ID(id))
		}
	default:
		return fmt.Errorf("%w: unknown op %v", localwire.ErrMalformed, h.Op)
	}
	b, err := localwire.Finish(b)
	if err != nil {
		return err
	}
	cn.out = b
	if _, err := cn.c.Write(b); err != nil {
		return fmt.Errorf("write response: %w", err)
	}
	return nil
}
