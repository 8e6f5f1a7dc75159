package conn

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
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
// a time (singleflight) under the dialer's context. A handshake whose QPs
// on one NIC could not be connected for a fault of that NIC's rail
// (railFault) is made again, at once, without the NIC: one rail going
// down must not fail the connection while another rail is usable, and
// the port's own event may come after. Each attempt leaves out one more
// NIC, so there are at most as many as NICs, each bounded by
// HandshakeTimeout. Only when no rail connects does it fail, naming the
// rails tried.
func (d *Dialer) connect(peer string) (*AddrConnection, error) {
	if err := d.begin(); err != nil {
		return nil, err
	}
	defer d.handshake.Done()

	var faults railFaults
	skip := make(map[*localNIC]bool)
	for {
		c, err := d.attempt(peer, skip)
		var rf *RailFaultError
		if err == nil || !errors.As(err, &rf) {
			return c, err
		}
		faults = append(faults, rf)
		skip[rf.nic] = true
		left := d.nics.upNICsBut(skip)
		if len(left) == 0 {
			return nil, fmt.Errorf("%w: handshake %s: %w: %w", ErrConnectionBroken, peer, ErrNoRail, faults)
		}
		d.log.Warn().Str("peer", peer).Str("nic", rf.NIC).Str("rail", rf.Rail).Bool("port_down", rf.PortDown).
			Int("nics_left", len(left)).Msg("rdma handshake failed on one rail; handshaking again without it")
	}
}

// attempt is one handshake over the NICs that are up, less skip. Its
// phases: prepareHandshake (QPs in INIT on each NIC), exchange (the RPC),
// validateResponse, connectQPs, publish, then the workers start. An error
// wrapping *RailFaultError names the NIC to leave out of the next one.
func (d *Dialer) attempt(peer string, skip map[*localNIC]bool) (_ *AddrConnection, err error) {
	hsID := newHandshakeID()
	log := d.log.With().Str("peer", peer).Str("session", hsID).Logger()
	start := time.Now()
	d.setConnecting(peer, start)
	defer d.setConnecting(peer, time.Time{})

	result := resultError
	defer func() {
		d.met.Handshakes.WithLabelValues(RoleRequester, result).Inc()
		if err != nil {
			log.Warn().Err(err).Str("result", result).Dur("took", time.Since(start)).Msg("rdma handshake failed")
		}
	}()

	req, prepared, err := d.prepareHandshake(peer, hsID, skip)
	if err != nil {
		return nil, err
	}
	// The guard destroys the prepared QPs on every failure path, so no
	// prepared QP outlives a failed handshake.
	ok := false
	defer func() {
		if !ok {
			destroyPrepared(d.nics, prepared)
		}
	}()
	client, resp, res, err := d.exchange(peer, req)
	if err != nil {
		result = res
		return nil, err
	}
	// From here on the holder has an accepted connection for hsID: if this
	// side gives up before publishing, tell it.
	defer func() {
		if !ok {
			d.goDisconnect(client, peer, hsID, log)
		}
	}()
	remote, err := d.validateResponse(resp, len(prepared))
	if err != nil {
		result = resultInvalid
		return nil, fmt.Errorf("%w: from %s: %w", ErrHandshakeRejected, peer, err)
	}
	c := &AddrConnection{
		d:            d,
		client:       client,
		peer:         peer,
		remoteNodeID: resp.GetHolderNodeId(),
		remoteInc:    resp.GetHolderIncarnation(),
		handshakeID:  hsID,
		since:        time.Now(),
		done:         make(chan struct{}),
		log:          log,
	}
	if err := d.connectQPs(c, remote, prepared); err != nil {
		if errors.As(err, new(*RailFaultError)) {
			result = resultRailFault
		}
		return nil, err
	}
	old, err := d.publish(c)
	if err != nil {
		return nil, err
	}
	ok = true

	c.startWorkers()
	c.prewarm()
	d.met.Conns.WithLabelValues(RoleRequester, StateConnected).Inc()
	result = resultOK
	if old != nil {
		// Singleflight makes this unreachable; if it ever happens the old
		// connection must not linger half-owned.
		log.Warn().Msg("replaced a live connection to the same peer")
		old.invalidate(errors.New("replaced by a new handshake"))
	}
	log.Info().Str("remote_node", c.remoteNodeID).Int("nics", len(c.nics)).
		Int("qps", len(c.nics)*d.opts.QPsPerPeer).Dur("took", time.Since(start)).Msg("rdma connection established")
	return c, nil
}

// prepareHandshake creates QPsPerPeer QPs (INIT) on every NIC whose port
// is up (a NIC that is down would take READs that never complete; see
// rail.go), less those in skip, and the request that offers them. On
// error it destroys what it created.
func (d *Dialer) prepareHandshake(peer, hsID string, skip map[*localNIC]bool) (*pegadv1.RdmaHandshakeRequest, [][]*qpPair, error) {
	nics := d.nics.upNICsBut(skip)
	if len(nics) == 0 {
		return nil, nil, fmt.Errorf("%w: handshake %s: %w", ErrConnectionBroken, peer, ErrNoActiveNIC)
	}
	prepared := make([][]*qpPair, len(nics))
	req := &pegadv1.RdmaHandshakeRequest{
		Requester:   &pegadv1.Requester{NodeId: d.nics.opts.NodeID, Incarnation: d.nics.opts.Incarnation, Advertise: d.opts.Advertise},
		Transport:   d.nics.opts.Transport,
		HandshakeId: hsID,
	}
	for i, n := range nics {
		nh := &pegadv1.NicHandshake{Nic: n.info.Name, Memory: []*pegadv1.MemoryRegion{d.nics.localRegion(n)},
			LinkLayer: n.info.LinkLayer, Subnet: n.currentSubnet(), Rail: n.rail}
		for q := 0; q < d.opts.QPsPerPeer; q++ {
			p, err := d.nics.newQPPair(n, false)
			if err != nil {
				destroyPrepared(d.nics, prepared)
				return nil, nil, fmt.Errorf("conn: handshake %s: %w", peer, err)
			}
			prepared[i] = append(prepared[i], p)
			nh.Endpoints = append(nh.Endpoints, endpointToProto(d.nics.localEndpoint(p)))
		}
		req.Nics = append(req.Nics, nh)
	}
	return req, prepared, nil
}

func destroyPrepared(ns *NICs, prepared [][]*qpPair) {
	for _, qs := range prepared {
		for _, p := range qs {
			p.destroy(ns)
		}
	}
}

// exchange dials peer and sends the handshake. On error, result is the
// handshake metric's result for it: unreachable (dial, transport, timeout,
// cancel) or rejected (the holder refused).
func (d *Dialer) exchange(peer string, req *pegadv1.RdmaHandshakeRequest) (
	client pegadv1.PeerServiceClient, resp *pegadv1.RdmaHandshakeResponse, result string, err error) {
	client, err = d.opts.Dial(peer)
	if err != nil {
		return nil, nil, resultUnreachable, fmt.Errorf("%w: dial %s: %w", ErrConnectionBroken, peer, err)
	}
	if d.hookBeforeRPC != nil {
		d.hookBeforeRPC(peer)
	}
	hctx, cancel := context.WithTimeout(d.ctx, d.opts.HandshakeTimeout)
	defer cancel()
	resp, err = client.RdmaHandshake(hctx, req)
	if err == nil {
		return client, resp, "", nil
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
		if d.ctx.Err() != nil {
			return nil, nil, resultUnreachable, ErrClosed
		}
		return nil, nil, resultUnreachable, fmt.Errorf("%w: handshake with %s: %w", ErrConnectionBroken, peer, err)
	}
	return nil, nil, resultRejected, fmt.Errorf("%w: by %s: %w", ErrHandshakeRejected, peer, err)
}

// connectQPs connects each prepared QP to the holder's endpoint for it
// (RTR, RTS) and adds the NICs and their sessions to c. A connect that
// failed for a fault of its NIC's rail returns a *RailFaultError.
func (d *Dialer) connectQPs(c *AddrConnection, remote []remoteNIC, prepared [][]*qpPair) error {
	for i, qs := range prepared {
		n := qs[0].nic // QPsPerPeer >= 1
		cn := &connNic{nic: n, remote: remote[i].regions, probe: remote[i].probe}
		attr := d.nics.connectAttr(n)
		for q, p := range qs {
			if err := p.qp.Connect(remote[i].endpoints[q], attr); err != nil {
				err = fmt.Errorf("connect qp %d on %s to %s: %w", p.qpn, n.info.Name, c.peer, err)
				if rf := d.railFault(n, err); rf != nil {
					return rf
				}
				return fmt.Errorf("%w: %w", ErrConnectionBroken, err)
			}
			cn.sessions = append(cn.sessions, newSession(p, d.met))
		}
		c.nics = append(c.nics, cn)
	}
	return nil
}

// publish makes c the connection to its peer, atomically, and returns the
// one it replaced (nil: none); ErrClosed when the dialer closed meanwhile
// (the caller tears c down).
func (d *Dialer) publish(c *AddrConnection) (old *AddrConnection, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	old = d.peers[c.peer]
	d.peers[c.peer] = c
	d.conns.Add(1) // under mu: Close sets closed before it Waits
	return old, nil
}

// setConnecting records (or, with a zero time, clears) a handshake in
// flight toward peer, for List and the Conns gauge.
func (d *Dialer) setConnecting(peer string, since time.Time) {
	g := d.met.Conns.WithLabelValues(RoleRequester, StateConnecting)
	d.mu.Lock()
	defer d.mu.Unlock()
	if since.IsZero() {
		delete(d.connecting, peer)
		g.Dec()
		return
	}
	d.connecting[peer] = since
	g.Inc()
}

func (s *NICs) localRegion(n *localNIC) *pegadv1.MemoryRegion {
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
func (d *Dialer) validateResponse(resp *pegadv1.RdmaHandshakeResponse, want int) ([]remoteNIC, error) {
	if resp == nil {
		return nil, fmt.Errorf("%w: empty response", ErrInvalidHandshake)
	}
	if len(resp.GetNics()) != want {
		return nil, fmt.Errorf("%w: %d nics in response, want %d", ErrInvalidHandshake, len(resp.GetNics()), want)
	}
	out := make([]remoteNIC, len(resp.GetNics()))
	for i, nh := range resp.GetNics() {
		r, err := d.nics.parseNIC(nh, true)
		if err != nil {
			return nil, fmt.Errorf("nic %d: %w", i, err)
		}
		if len(r.endpoints) != d.opts.QPsPerPeer {
			return nil, fmt.Errorf("%w: nic %d: %d endpoints, want %d", ErrInvalidHandshake, i, len(r.endpoints), d.opts.QPsPerPeer)
		}
		out[i] = r
	}
	return out, nil
}

// parseNIC validates one NicHandshake off the network. Memory is required
// in responses (the requester READs it) and optional in requests.
func (s *NICs) parseNIC(nh *pegadv1.NicHandshake, needMemory bool) (remoteNIC, error) {
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
		ep, err := s.endpointFromProto(e)
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

func (s *NICs) endpointFromProto(e *pegadv1.Endpoint) (ibv.Endpoint, error) {
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
	if s.opts.Transport == "tcp" || e.GetAddr() != "" {
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
