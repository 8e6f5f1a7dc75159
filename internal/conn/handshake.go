package conn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/ibv"
)

// Limits on handshake metadata from the network.
const (
	maxNodeIDLen   = 256
	maxNICs        = limits.MaxNICs
	maxRegions     = 1024
	maxNICNameLen  = 256
	maxAddrLen     = 512
	maxHandshakeID = 128
	// minMaxEndpoints is the least maxEndpoints allows, whatever the
	// holder's NICs.
	minMaxEndpoints = 256
)

// connect is the requester side of a handshake; it runs once per peer at
// a time (singleflight) under the manager's context. Its phases:
// prepareHandshake (QPs in INIT on every NIC), exchange (the RPC),
// validateResponse, connectQPs, publish, then the workers start.
func (m *Manager) connect(peer string) (_ *AddrConnection, err error) {
	if err := m.begin(&m.handshake); err != nil {
		return nil, err
	}
	defer m.handshake.Done()

	hsID := newHandshakeID()
	log := m.log.With().Str("peer", peer).Str("session", hsID).Logger()
	start := time.Now()
	m.setConnecting(peer, start)
	defer m.setConnecting(peer, time.Time{})

	result := resultError
	defer func() {
		m.met.Handshakes.WithLabelValues(RoleRequester, result).Inc()
		if err != nil {
			log.Warn().Err(err).Str("result", result).Dur("took", time.Since(start)).Msg("rdma handshake failed")
		}
	}()

	req, prepared, err := m.prepareHandshake(peer, hsID)
	if err != nil {
		return nil, err
	}
	// The guard destroys the prepared QPs on every failure path, so no
	// prepared QP outlives a failed handshake.
	ok := false
	defer func() {
		if !ok {
			destroyPrepared(m, prepared)
		}
	}()
	client, resp, res, err := m.exchange(peer, req)
	if err != nil {
		result = res
		return nil, err
	}
	// From here on the holder has an accepted connection for hsID: if this
	// side gives up before publishing, tell it.
	defer func() {
		if !ok {
			m.goDisconnect(client, peer, hsID, log)
		}
	}()
	remote, err := m.validateResponse(resp, len(prepared))
	if err != nil {
		result = resultInvalid
		return nil, fmt.Errorf("%w: from %s: %w", ErrHandshakeRejected, peer, err)
	}
	c := &AddrConnection{
		m:            m,
		client:       client,
		peer:         peer,
		remoteNodeID: resp.GetHolderNodeId(),
		remoteInc:    resp.GetHolderIncarnation(),
		handshakeID:  hsID,
		since:        time.Now(),
		done:         make(chan struct{}),
		log:          log,
	}
	if err := m.connectQPs(c, remote, prepared); err != nil {
		return nil, err
	}
	old, err := m.publish(c)
	if err != nil {
		return nil, err
	}
	ok = true

	c.startWorkers()
	c.prewarm()
	m.met.Conns.WithLabelValues(RoleRequester, StateConnected).Inc()
	result = resultOK
	if old != nil {
		// Singleflight makes this unreachable; if it ever happens the old
		// connection must not linger half-owned.
		log.Warn().Msg("replaced a live connection to the same peer")
		old.invalidate(errors.New("replaced by a new handshake"))
	}
	log.Info().Str("remote_node", c.remoteNodeID).Int("nics", len(c.nics)).
		Int("qps", len(c.nics)*m.opts.QPsPerPeer).Dur("took", time.Since(start)).Msg("rdma connection established")
	return c, nil
}

// begin counts one handshake (m.handshake) or accept (m.accepts) in wg,
// which Close waits for (before it releases the PDs they use); ErrClosed
// once the manager is closed.
func (m *Manager) begin(wg *sync.WaitGroup) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return ErrClosed
	}
	wg.Add(1) // under mu: Close sets closed before it Waits
	return nil
}

// prepareHandshake creates QPsPerPeer QPs (INIT) on every NIC whose port
// is up (a NIC that is down would take READs that never complete; see
// rail.go) and the request that offers them. On error it destroys what it
// created.
func (m *Manager) prepareHandshake(peer, hsID string) (*pegadv1.RdmaHandshakeRequest, [][]*qpPair, error) {
	nics := m.upNICs()
	if len(nics) == 0 {
		return nil, nil, fmt.Errorf("%w: handshake %s: %w", ErrConnectionBroken, peer, ErrNoActiveNIC)
	}
	prepared := make([][]*qpPair, len(nics))
	req := &pegadv1.RdmaHandshakeRequest{
		Requester:   &pegadv1.Requester{NodeId: m.opts.NodeID, Incarnation: m.opts.Incarnation, Advertise: m.opts.Advertise},
		Transport:   m.opts.Transport,
		HandshakeId: hsID,
	}
	for i, n := range nics {
		nh := &pegadv1.NicHandshake{Nic: n.info.Name, Memory: []*pegadv1.MemoryRegion{m.localRegion(n)},
			LinkLayer: n.info.LinkLayer, Subnet: n.currentSubnet(), Rail: n.rail}
		for q := 0; q < m.opts.QPsPerPeer; q++ {
			p, err := m.newQPPair(n, false)
			if err != nil {
				destroyPrepared(m, prepared)
				return nil, nil, fmt.Errorf("conn: handshake %s: %w", peer, err)
			}
			prepared[i] = append(prepared[i], p)
			nh.Endpoints = append(nh.Endpoints, endpointToProto(m.localEndpoint(p)))
		}
		req.Nics = append(req.Nics, nh)
	}
	return req, prepared, nil
}

func destroyPrepared(m *Manager, prepared [][]*qpPair) {
	for _, qs := range prepared {
		for _, p := range qs {
			p.destroy(m)
		}
	}
}

// exchange dials peer and sends the handshake. On error, result is the
// handshake metric's result for it: unreachable (dial, transport, timeout,
// cancel) or rejected (the holder refused).
func (m *Manager) exchange(peer string, req *pegadv1.RdmaHandshakeRequest) (
	client pegadv1.PeerServiceClient, resp *pegadv1.RdmaHandshakeResponse, result string, err error) {
	client, err = m.opts.Dial(peer)
	if err != nil {
		return nil, nil, resultUnreachable, fmt.Errorf("%w: dial %s: %w", ErrConnectionBroken, peer, err)
	}
	if m.hookBeforeRPC != nil {
		m.hookBeforeRPC(peer)
	}
	hctx, cancel := context.WithTimeout(m.ctx, m.opts.HandshakeTimeout)
	defer cancel()
	resp, err = client.RdmaHandshake(hctx, req)
	if err == nil {
		return client, resp, "", nil
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		if m.ctx.Err() != nil {
			return nil, nil, resultUnreachable, ErrClosed
		}
		return nil, nil, resultUnreachable, fmt.Errorf("%w: handshake with %s: %w", ErrConnectionBroken, peer, err)
	}
	return nil, nil, resultRejected, fmt.Errorf("%w: by %s: %w", ErrHandshakeRejected, peer, err)
}

// connectQPs connects each prepared QP to the holder's endpoint for it
// (RTR, RTS) and adds the NICs and their sessions to c.
func (m *Manager) connectQPs(c *AddrConnection, remote []remoteNIC, prepared [][]*qpPair) error {
	for i, qs := range prepared {
		n := qs[0].nic // QPsPerPeer >= 1
		cn := &connNic{nic: n, remote: remote[i].regions, probe: remote[i].probe}
		attr := m.connectAttr(n)
		for q, p := range qs {
			if err := p.qp.Connect(remote[i].endpoints[q], attr); err != nil {
				return fmt.Errorf("%w: connect qp %d on %s to %s: %w", ErrConnectionBroken, p.qpn, n.info.Name, c.peer, err)
			}
			cn.sessions = append(cn.sessions, newSession(p, m.met))
		}
		c.nics = append(c.nics, cn)
	}
	return nil
}

// publish makes c the connection to its peer, atomically, and returns the
// one it replaced (nil: none); ErrClosed when the manager closed meanwhile
// (the caller tears c down).
func (m *Manager) publish(c *AddrConnection) (old *AddrConnection, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, ErrClosed
	}
	old = m.peers[c.peer]
	m.peers[c.peer] = c
	m.conns.Add(1) // under mu: Close sets closed before it Waits
	return old, nil
}

// setConnecting records (or, with a zero time, clears) a handshake in
// flight toward peer, for List and the Conns gauge.
func (m *Manager) setConnecting(peer string, since time.Time) {
	g := m.met.Conns.WithLabelValues(RoleRequester, StateConnecting)
	m.mu.Lock()
	defer m.mu.Unlock()
	if since.IsZero() {
		delete(m.connecting, peer)
		g.Dec()
		return
	}
	m.connecting[peer] = since
	g.Inc()
}

func (m *Manager) localRegion(n *localNIC) *pegadv1.MemoryRegion {
	return &pegadv1.MemoryRegion{Base: n.mr.Addr(), Length: n.mr.Len(), Rkey: n.mr.RKey()}
}

type remoteNIC struct {
	name      string
	linkLayer string // pairing (pairNICs)
	subnet    string
	rail      string
	endpoints []ibv.Endpoint
	regions   []ibv.RemoteRegion
	probe     ibv.RemoteRegion // the keepalive's target; Length 0: regions[0]
}

// validateResponse checks a holder's answer against what we asked for.
// want is the number of NICs the request offered.
func (m *Manager) validateResponse(resp *pegadv1.RdmaHandshakeResponse, want int) ([]remoteNIC, error) {
	if resp == nil {
		return nil, fmt.Errorf("%w: empty response", ErrInvalidHandshake)
	}
	if len(resp.GetNics()) != want {
		return nil, fmt.Errorf("%w: %d nics in response, want %d", ErrInvalidHandshake, len(resp.GetNics()), want)
	}
	out := make([]remoteNIC, len(resp.GetNics()))
	for i, nh := range resp.GetNics() {
		r, err := m.parseNIC(nh, true)
		if err != nil {
			return nil, fmt.Errorf("nic %d: %w", i, err)
		}
		if len(r.endpoints) != m.opts.QPsPerPeer {
			return nil, fmt.Errorf("%w: nic %d: %d endpoints, want %d", ErrInvalidHandshake, i, len(r.endpoints), m.opts.QPsPerPeer)
		}
		out[i] = r
	}
	return out, nil
}

// parseNIC validates one NicHandshake off the network. Memory is required
// in responses (the requester READs it) and optional in requests.
func (m *Manager) parseNIC(nh *pegadv1.NicHandshake, needMemory bool) (remoteNIC, error) {
	var r remoteNIC
	if nh == nil {
		return r, fmt.Errorf("%w: nil nic", ErrInvalidHandshake)
	}
	if len(nh.GetNic()) > maxNICNameLen || len(nh.GetLinkLayer()) > maxNICNameLen || len(nh.GetSubnet()) > maxNICNameLen ||
		len(nh.GetRail()) > maxNICNameLen {
		return r, fmt.Errorf("%w: nic name, link layer, subnet or rail too long", ErrInvalidHandshake)
	}
	r.name, r.linkLayer, r.subnet, r.rail = nh.GetNic(), nh.GetLinkLayer(), nh.GetSubnet(), nh.GetRail()
	eps := nh.GetEndpoints()
	if len(eps) == 0 || len(eps) > maxQPsPerPeer {
		return r, fmt.Errorf("%w: %d endpoints (want 1..%d)", ErrInvalidHandshake, len(eps), maxQPsPerPeer)
	}
	for j, e := range eps {
		ep, err := m.endpointFromProto(e)
		if err != nil {
			return r, fmt.Errorf("endpoint %d: %w", j, err)
		}
		r.endpoints = append(r.endpoints, ep)
	}
	mem := nh.GetMemory()
	if needMemory && len(mem) == 0 {
		return r, fmt.Errorf("%w: empty memory snapshot", ErrInvalidHandshake)
	}
	if len(mem) > maxRegions {
		return r, fmt.Errorf("%w: %d memory regions (max %d)", ErrInvalidHandshake, len(mem), maxRegions)
	}
	for j, mr := range mem {
		if mr == nil || mr.GetLength() == 0 || mr.GetBase()+mr.GetLength() < mr.GetBase() {
			return r, fmt.Errorf("%w: memory region %d malformed", ErrInvalidHandshake, j)
		}
		r.regions = append(r.regions, ibv.RemoteRegion{Base: mr.GetBase(), Length: mr.GetLength(), RKey: mr.GetRkey()})
	}
	if pr := nh.GetProbe(); pr != nil {
		if pr.GetLength() == 0 || pr.GetBase()+pr.GetLength() < pr.GetBase() {
			return r, fmt.Errorf("%w: probe region malformed", ErrInvalidHandshake)
		}
		r.probe = ibv.RemoteRegion{Base: pr.GetBase(), Length: pr.GetLength(), RKey: pr.GetRkey()}
	}
	return r, nil
}

func endpointToProto(e ibv.Endpoint) *pegadv1.Endpoint {
	p := &pegadv1.Endpoint{Gid: append([]byte(nil), e.GID[:]...), Lid: uint32(e.LID), Qpn: e.QPN,
		Psn: e.PSN, Addr: e.Addr, Mtu: uint32(e.MTU), MaxDestRdAtomic: uint32(e.MaxDestRd)}
	if e.Secret != ([16]byte{}) {
		p.Secret = append([]byte(nil), e.Secret[:]...)
	}
	return p
}

func (m *Manager) endpointFromProto(e *pegadv1.Endpoint) (ibv.Endpoint, error) {
	var ep ibv.Endpoint
	switch {
	case e == nil:
		return ep, fmt.Errorf("%w: nil endpoint", ErrInvalidHandshake)
	case e.GetQpn() == 0 || e.GetQpn() >= 1<<24:
		return ep, fmt.Errorf("%w: qpn %d out of range", ErrInvalidHandshake, e.GetQpn())
	case e.GetPsn() >= 1<<24:
		return ep, fmt.Errorf("%w: psn %d out of range", ErrInvalidHandshake, e.GetPsn())
	case e.GetLid() > 0xffff:
		return ep, fmt.Errorf("%w: lid %d out of range", ErrInvalidHandshake, e.GetLid())
	case len(e.GetGid()) != 0 && len(e.GetGid()) != len(ep.GID):
		return ep, fmt.Errorf("%w: gid of %d bytes", ErrInvalidHandshake, len(e.GetGid()))
	case e.GetMtu() > 1<<20:
		return ep, fmt.Errorf("%w: mtu %d", ErrInvalidHandshake, e.GetMtu())
	case len(e.GetAddr()) > maxAddrLen:
		return ep, fmt.Errorf("%w: addr too long", ErrInvalidHandshake)
	case e.GetMaxDestRdAtomic() > 255:
		return ep, fmt.Errorf("%w: max_dest_rd_atomic %d", ErrInvalidHandshake, e.GetMaxDestRdAtomic())
	case len(e.GetSecret()) != 0 && len(e.GetSecret()) != len(ep.Secret):
		return ep, fmt.Errorf("%w: secret of %d bytes, want %d", ErrInvalidHandshake, len(e.GetSecret()), len(ep.Secret))
	}
	if m.opts.Transport == "tcp" || e.GetAddr() != "" {
		if _, _, err := net.SplitHostPort(e.GetAddr()); err != nil {
			return ep, fmt.Errorf("%w: endpoint addr %q: %v", ErrInvalidHandshake, e.GetAddr(), err)
		}
	}
	copy(ep.GID[:], e.GetGid())
	ep.LID = uint16(e.GetLid())
	ep.QPN = e.GetQpn()
	ep.PSN = e.GetPsn()
	ep.MTU = int(e.GetMtu())
	ep.Addr = e.GetAddr()
	ep.MaxDestRd = uint8(e.GetMaxDestRdAtomic())
	copy(ep.Secret[:], e.GetSecret())
	return ep, nil
}

// acceptedConn is the holder side of one requester's connection: QPs that
// the requester READs through. It runs nothing; it is destroyed when its
// requester disconnects it (RdmaDisconnect with its handshake id), when the
// same requester restarts (handshakes with another incarnation), when it is
// found idle with no data connection (its requester is gone; see reap), at
// the end of its drain time after a reconnect (retired), or at Close.
type acceptedConn struct {
	m           *Manager
	nodeID      string
	incarnation string
	remoteAddr  string
	advertise   string // the requester's advertised address, as it sent it
	handshakeID string
	since       time.Time // when Accept began (monotonic): orders attempts
	// nics[i] are the QPs on the local NIC paired (pairNICs) with the
	// requester's nic i.
	nics [][]*qpPair

	// retired (guarded by m.mu): a newer handshake of the same requester
	// replaced it; it serves in-flight READs until it drains.
	retired bool
	once    sync.Once
}

// Accept is the holder side of RdmaHandshake. Malformed metadata returns
// an error wrapping ErrInvalidHandshake (the RPC layer's InvalidArgument);
// any failure after QPs were created destroys them (the handshake is
// aborted: nothing is left half-built on this side). Its phases:
// validateRequest, newAccepted, acceptQPs (create and connect a QP for
// each of the requester's endpoints), install.
func (m *Manager) Accept(ctx context.Context, req *pegadv1.RdmaHandshakeRequest) (_ *pegadv1.RdmaHandshakeResponse, err error) {
	began := time.Now()
	result := resultError
	defer func() {
		m.met.Handshakes.WithLabelValues(RoleHolder, result).Inc()
		err = withStatus(err)
	}()
	// Close waits for running accepts before it releases the PDs they use.
	if err := m.begin(&m.accepts); err != nil {
		return nil, err
	}
	defer m.accepts.Done()
	if m.hookAccept != nil {
		m.hookAccept(req)
	}
	reqNICs, err := m.validateRequest(req)
	if err != nil {
		result = resultInvalid
		if ok, suppressed := m.invalidLog.Allow(); ok {
			m.log.Warn().Err(err).Str("session", truncate(req.GetHandshakeId(), maxHandshakeID)).
				Uint64("suppressed", suppressed).Msg("rejected malformed rdma handshake")
		}
		return nil, err
	}
	a := m.newAccepted(ctx, req, began)
	log := m.log.With().Str("peer", a.remoteAddr).Str("remote_node", a.nodeID).Str("session", a.handshakeID).Logger()

	ok := false
	defer func() {
		if !ok {
			a.destroyQPs()
			log.Warn().Err(err).Msg("rdma handshake aborted on accept side")
		}
	}()
	resp, err := m.acceptQPs(ctx, a, reqNICs, log)
	if err != nil {
		return nil, err
	}
	old, gone, err := m.install(a)
	if err != nil {
		return nil, err
	}
	ok = true
	m.met.Conns.WithLabelValues(RoleHolder, StateConnected).Inc()
	result = resultOK
	if old != nil {
		log.Info().Str("old_incarnation", old.incarnation).Str("incarnation", a.incarnation).
			Str("old_session", old.handshakeID).Bool("old_draining", old.incarnation == a.incarnation).
			Msg("new accepted connection from the same requester")
	}
	for _, g := range gone {
		g.destroy("replaced")
	}
	log.Info().Int("nics", len(a.nics)).Int("qps", a.qpCount()).Msg("rdma handshake accepted")
	return resp, nil
}

// newAccepted is the accepted side of req's handshake, with no QPs yet.
func (m *Manager) newAccepted(ctx context.Context, req *pegadv1.RdmaHandshakeRequest, began time.Time) *acceptedConn {
	a := &acceptedConn{
		m:           m,
		nodeID:      req.GetRequester().GetNodeId(),
		incarnation: req.GetRequester().GetIncarnation(),
		handshakeID: req.GetHandshakeId(),
		since:       began,
		remoteAddr:  req.GetRequester().GetNodeId(),
		advertise:   truncate(req.GetRequester().GetAdvertise(), maxNodeIDLen),
	}
	if p, ok := grpcpeer.FromContext(ctx); ok && p.Addr != nil {
		a.remoteAddr = p.Addr.String()
	}
	return a
}

// acceptQPs pairs each of the requester's NICs with a local one, creates a
// QP for each of its endpoints and connects it, and answers with this
// side's endpoints. Every QP it creates is in a.nics at once, so that the
// caller's guard destroys it on failure.
func (m *Manager) acceptQPs(ctx context.Context, a *acceptedConn, reqNICs []remoteNIC, log zerolog.Logger) (*pegadv1.RdmaHandshakeResponse, error) {
	resp := &pegadv1.RdmaHandshakeResponse{HolderNodeId: m.opts.NodeID, HolderIncarnation: m.opts.Incarnation}
	pairs := m.pairNICs(reqNICs, log)
	if pairs == nil {
		return nil, fmt.Errorf("conn: accept: %w", ErrNoActiveNIC)
	}
	for i, rn := range reqNICs {
		n := pairs[i]
		attr := m.connectAttr(n)
		nh := &pegadv1.NicHandshake{Nic: n.info.Name, Memory: []*pegadv1.MemoryRegion{m.localRegion(n)},
			LinkLayer: n.info.LinkLayer, Subnet: n.currentSubnet(), Rail: n.rail, Probe: m.probeRegion(n)}
		var qs []*qpPair
		for _, rep := range rn.endpoints {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			p, err := m.newQPPair(n, true)
			if err != nil {
				return nil, fmt.Errorf("conn: accept: %w", err)
			}
			qs = append(qs, p)
			a.nics = append(a.nics[:i], qs) // keep every created QP reachable by the guard
			if err := p.qp.Connect(rep, attr); err != nil {
				return nil, fmt.Errorf("conn: accept: connect qp %d to %s: %w", p.qpn, rep.Addr, err)
			}
			nh.Endpoints = append(nh.Endpoints, endpointToProto(m.localEndpoint(p)))
		}
		resp.Nics = append(resp.Nics, nh)
	}
	return resp, nil
}

// install makes a the accepted connection of its requester node. The
// previous connection of that node is retired, not destroyed, when the
// requester is the same process (a reconnect): Reads still in flight on
// its invalidated side keep their QPs until they finish, it disconnects
// that handshake, or a drain time passes. A restarted requester (another
// incarnation) is gone with all its generations: they are returned in
// gone, for the caller to destroy. An error (closed, or superseded by a
// later attempt) installs nothing.
func (m *Manager) install(a *acceptedConn) (old *acceptedConn, gone []*acceptedConn, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, nil, ErrClosed
	}
	old = m.accepted[a.nodeID]
	if old != nil && old.incarnation == a.incarnation && old.since.After(a.since) {
		// A later attempt of the same requester already won: this one was
		// given up by its requester (it handshakes one peer at a time).
		return nil, nil, fmt.Errorf("conn: accept: superseded by handshake %s", old.handshakeID)
	}
	m.accepted[a.nodeID] = a
	if old != nil {
		if old.incarnation == a.incarnation {
			gone = m.retireLocked(old, time.Now())
		} else {
			gone = append(m.dropRetiredLocked(a.nodeID), old)
		}
	}
	return old, gone, nil
}

// Disconnect is the holder side of RdmaDisconnect: the requester abandoned
// the connection made by one handshake, so its accepted side (QPs, CQs) is
// torn down now rather than when that requester next handshakes. Only the
// connection of req's node with req's handshake id and incarnation goes: a
// disconnect that races with (or arrives after) a newer handshake of the
// same node never touches the newer connection. Unknown or mismatched is
// not an error (0 QPs released); malformed metadata wraps
// ErrInvalidHandshake (codes.InvalidArgument on the wire).
func (m *Manager) Disconnect(ctx context.Context, req *pegadv1.RdmaDisconnectRequest) (_ *pegadv1.RdmaDisconnectResponse, err error) {
	defer func() { err = withStatus(err) }()
	node, hsID := req.GetRequester().GetNodeId(), req.GetHandshakeId()
	switch {
	case node == "":
		return nil, fmt.Errorf("%w: requester node_id missing", ErrInvalidHandshake)
	case len(node) > maxNodeIDLen || len(req.GetRequester().GetIncarnation()) > maxNodeIDLen:
		return nil, fmt.Errorf("%w: requester id too long", ErrInvalidHandshake)
	case hsID == "":
		return nil, fmt.Errorf("%w: handshake_id missing", ErrInvalidHandshake)
	case len(hsID) > maxHandshakeID:
		return nil, fmt.Errorf("%w: handshake_id too long", ErrInvalidHandshake)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return &pegadv1.RdmaDisconnectResponse{}, nil // Close tears everything down
	}
	a := m.accepted[node]
	if a != nil && a.handshakeID == hsID && a.incarnation == req.GetRequester().GetIncarnation() {
		delete(m.accepted, node)
	} else if a = m.retiredLocked(node, hsID, req.GetRequester().GetIncarnation()); a != nil {
		delete(m.retired, a)
	} else {
		m.mu.Unlock()
		return &pegadv1.RdmaDisconnectResponse{}, nil
	}
	// Close must not release the PDs while this destroys a's QPs.
	m.accepts.Add(1) // under mu: Close sets closed before it Waits
	m.mu.Unlock()
	defer m.accepts.Done()
	n := a.qpCount()
	a.destroy("disconnect")
	m.log.Info().Str("peer", a.remoteAddr).Str("remote_node", node).Str("session", hsID).Int("qps", n).
		Msg("accepted rdma connection released by its requester")
	return &pegadv1.RdmaDisconnectResponse{QpsReleased: uint32(n)}, nil
}

// validateRequest checks everything in a handshake request that comes off
// the network before any resource is created.
func (m *Manager) validateRequest(req *pegadv1.RdmaHandshakeRequest) ([]remoteNIC, error) {
	if req == nil {
		return nil, fmt.Errorf("%w: empty request", ErrInvalidHandshake)
	}
	id := req.GetRequester().GetNodeId()
	switch {
	case req.GetRequester() == nil || id == "":
		return nil, fmt.Errorf("%w: requester node_id missing", ErrInvalidHandshake)
	case len(id) > maxNodeIDLen || len(req.GetRequester().GetIncarnation()) > maxNodeIDLen:
		return nil, fmt.Errorf("%w: requester id too long", ErrInvalidHandshake)
	case len(req.GetHandshakeId()) > maxHandshakeID:
		return nil, fmt.Errorf("%w: handshake_id too long", ErrInvalidHandshake)
	case req.GetTransport() != m.opts.Transport:
		return nil, fmt.Errorf("%w: transport %q, this node uses %q", ErrInvalidHandshake, truncate(req.GetTransport(), 32), m.opts.Transport)
	case len(req.GetNics()) == 0 || len(req.GetNics()) > maxNICs:
		return nil, fmt.Errorf("%w: %d nics (want 1..%d)", ErrInvalidHandshake, len(req.GetNics()), maxNICs)
	}
	out := make([]remoteNIC, len(req.GetNics()))
	total := 0
	for i, nh := range req.GetNics() {
		r, err := m.parseNIC(nh, false)
		if err != nil {
			return nil, fmt.Errorf("nic %d: %w", i, err)
		}
		total += len(r.endpoints)
		out[i] = r
	}
	if limit := m.maxEndpoints(); total > limit {
		return nil, fmt.Errorf("%w: %d endpoints in total (at most %d)", ErrInvalidHandshake, total, limit)
	}
	return out, nil
}

func (a *acceptedConn) qpCount() int {
	n := 0
	for _, qs := range a.nics {
		n += len(qs)
	}
	return n
}

func (a *acceptedConn) destroyQPs() {
	for _, qs := range a.nics {
		for _, p := range qs {
			p.destroy(a.m)
		}
	}
}

// destroy tears an installed accepted connection down, once. The caller
// has already removed it from the map (or owns it exclusively).
func (a *acceptedConn) destroy(reason string) {
	a.once.Do(func() {
		// Counted before the QPs go: whoever sees the QP gauge fall sees
		// why (the disconnect tests read both).
		a.m.met.Invalidations.WithLabelValues(reason).Inc()
		a.destroyQPs()
		state := StateConnected
		if a.retired { // removed from the maps already: no writer left
			state = StateInvalidated
		}
		a.m.met.Conns.WithLabelValues(RoleHolder, state).Dec()
		a.m.log.Debug().Str("peer", a.remoteAddr).Str("session", a.handshakeID).Str("reason", reason).Msg("accepted connection destroyed")
	})
}

func (a *acceptedConn) info() ConnInfo {
	ci := ConnInfo{Peer: a.remoteAddr, RemoteNodeID: a.nodeID, RemoteAdvertise: a.advertise, Role: RoleHolder, State: StateConnected, Since: a.since}
	for _, qs := range a.nics {
		ni := NICInfo{QPs: len(qs)}
		for _, p := range qs {
			ni.Name = p.nic.info.Name
			ni.LocalQPNs = append(ni.LocalQPNs, p.qpn)
		}
		ci.NICs = append(ci.NICs, ni)
		ci.QPs += len(qs)
	}
	return ci
}

// acceptError carries the gRPC code an Accept failure should have on the
// wire, so the holder's RPC layer (which passes status errors through)
// needs no knowledge of conn's sentinels. errors.Is still sees the cause.
type acceptError struct {
	err    error
	code   codes.Code
	reason pegaderr.Reason
}

func (e *acceptError) Error() string { return e.err.Error() }
func (e *acceptError) Unwrap() error { return e.err }
func (e *acceptError) GRPCStatus() *status.Status {
	return pegaderr.Status(e.code, e.reason, e.err.Error())
}

// withStatus maps an Accept error: malformed metadata is InvalidArgument
// (reason INVALID), a closed manager Unavailable (DRAINING: the node is
// shutting down), a canceled or expired RPC keeps its context error, and
// any other failure (resources, connect) is Aborted (HANDSHAKE_ABORTED):
// the handshake was aborted and left nothing behind; the requester may
// retry.
func withStatus(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, ErrInvalidHandshake):
		return &acceptError{err: err, code: codes.InvalidArgument, reason: pegaderr.Invalid}
	case errors.Is(err, ErrClosed):
		return &acceptError{err: err, code: codes.Unavailable, reason: pegaderr.Draining}
	}
	return &acceptError{err: err, code: codes.Aborted, reason: pegaderr.HandshakeAborted}
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// maxEndpoints bounds the QPs one handshake makes a holder create: as
// many as a requester with as many NICs as this node, each with the most
// QPs a peer may use, asks for (a requester configured like this node
// always fits), and at least minMaxEndpoints.
func (m *Manager) maxEndpoints() int {
	return max(minMaxEndpoints, len(m.curNICs())*maxQPsPerPeer)
}
