package conn

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	grpcpeer "google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/api/pegaderr"
)

// acceptedConn is the holder side of one requester's connection: QPs that
// the requester READs through. It runs nothing; it is destroyed when its
// requester disconnects it (RdmaDisconnect with its handshake id), when the
// same requester restarts (handshakes with another incarnation), when it is
// found idle with no data connection (its requester is gone; see reap), at
// the end of its drain time after a reconnect (retired), or at Close.
type acceptedConn struct {
	acc         *Acceptor
	nodeID      string
	incarnation string
	remoteAddr  string
	advertise   string // the requester's advertised address, as it sent it
	handshakeID string
	since       time.Time // when Accept began (monotonic): orders attempts
	// nics[i] are the QPs on the local NIC paired (pairNICs) with the
	// requester's nic i.
	nics [][]*qpPair

	// retired (guarded by acc.mu): a newer handshake of the same requester
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
func (acc *Acceptor) Accept(ctx context.Context, req *pegadv1.RdmaHandshakeRequest) (_ *pegadv1.RdmaHandshakeResponse, err error) {
	began := time.Now()
	result := resultError
	defer func() {
		acc.met.Handshakes.WithLabelValues(RoleHolder, result).Inc()
		err = withStatus(err)
	}()
	// Close waits for running accepts before it releases the PDs they use.
	if err := acc.begin(); err != nil {
		return nil, err
	}
	defer acc.accepts.Done()
	if acc.hookAccept != nil {
		acc.hookAccept(req)
	}
	reqNICs, err := acc.validateRequest(req)
	if err != nil {
		result = resultInvalid
		if ok, suppressed := acc.invalidLog.Allow(); ok {
			acc.log.Warn().Err(err).Str("session", truncate(req.GetHandshakeId(), maxHandshakeID)).
				Uint64("suppressed", suppressed).Msg("rejected malformed rdma handshake")
		}
		return nil, err
	}
	a := acc.newAccepted(ctx, req, began)
	log := acc.log.With().Str("peer", a.remoteAddr).Str("remote_node", a.nodeID).Str("session", a.handshakeID).Logger()

	ok := false
	defer func() {
		if !ok {
			a.destroyQPs()
			log.Warn().Err(err).Msg("rdma handshake aborted on accept side")
		}
	}()
	resp, err := acc.acceptQPs(ctx, a, reqNICs, log)
	if err != nil {
		return nil, err
	}
	old, gone, err := acc.install(a)
	if err != nil {
		return nil, err
	}
	ok = true
	acc.met.Conns.WithLabelValues(RoleHolder, StateConnected).Inc()
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
func (acc *Acceptor) newAccepted(ctx context.Context, req *pegadv1.RdmaHandshakeRequest, began time.Time) *acceptedConn {
	a := &acceptedConn{
		acc:         acc,
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
func (acc *Acceptor) acceptQPs(ctx context.Context, a *acceptedConn, reqNICs []remoteNIC, log zerolog.Logger) (*pegadv1.RdmaHandshakeResponse, error) {
	resp := &pegadv1.RdmaHandshakeResponse{HolderNodeId: acc.nics.opts.NodeID, HolderIncarnation: acc.nics.opts.Incarnation}
	pairs := acc.nics.pairNICs(reqNICs, log)
	if pairs == nil {
		return nil, fmt.Errorf("conn: accept: %w", ErrNoActiveNIC)
	}
	for i, rn := range reqNICs {
		n := pairs[i]
		attr := acc.nics.connectAttr(n)
		nh := &pegadv1.NicHandshake{Nic: n.info.Name, Memory: []*pegadv1.MemoryRegion{acc.nics.localRegion(n)},
			LinkLayer: n.info.LinkLayer, Subnet: n.currentSubnet(), Rail: n.rail, Probe: acc.nics.probeRegion(n)}
		var qs []*qpPair
		for _, rep := range rn.endpoints {
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			p, err := acc.nics.newQPPair(n, true)
			if err != nil {
				return nil, fmt.Errorf("conn: accept: %w", err)
			}
			qs = append(qs, p)
			a.nics = append(a.nics[:i], qs) // keep every created QP reachable by the guard
			if err := p.qp.Connect(rep, attr); err != nil {
				return nil, fmt.Errorf("conn: accept: connect qp %d to %s: %w", p.qpn, rep.Addr, err)
			}
			nh.Endpoints = append(nh.Endpoints, endpointToProto(acc.nics.localEndpoint(p)))
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
func (acc *Acceptor) install(a *acceptedConn) (old *acceptedConn, gone []*acceptedConn, err error) {
	acc.mu.Lock()
	defer acc.mu.Unlock()
	if acc.closed {
		return nil, nil, ErrClosed
	}
	old = acc.accepted[a.nodeID]
	if old != nil && old.incarnation == a.incarnation && old.since.After(a.since) {
		// A later attempt of the same requester already won: this one was
		// given up by its requester (it handshakes one peer at a time).
		return nil, nil, fmt.Errorf("conn: accept: superseded by handshake %s", old.handshakeID)
	}
	acc.accepted[a.nodeID] = a
	if old != nil {
		if old.incarnation == a.incarnation {
			gone = acc.retireLocked(old, time.Now())
		} else {
			gone = append(acc.dropRetiredLocked(a.nodeID), old)
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
func (acc *Acceptor) Disconnect(ctx context.Context, req *pegadv1.RdmaDisconnectRequest) (_ *pegadv1.RdmaDisconnectResponse, err error) {
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
	acc.mu.Lock()
	if acc.closed {
		acc.mu.Unlock()
		return &pegadv1.RdmaDisconnectResponse{}, nil // Close tears everything down
	}
	a := acc.accepted[node]
	if a != nil && a.handshakeID == hsID && a.incarnation == req.GetRequester().GetIncarnation() {
		delete(acc.accepted, node)
	} else if a = acc.retiredLocked(node, hsID, req.GetRequester().GetIncarnation()); a != nil {
		delete(acc.retired, a)
	} else {
		acc.mu.Unlock()
		return &pegadv1.RdmaDisconnectResponse{}, nil
	}
	// Close must not release the PDs while this destroys a's QPs.
	acc.accepts.Add(1) // under mu: Close sets closed before it Waits
	acc.mu.Unlock()
	defer acc.accepts.Done()
	n := a.qpCount()
	a.destroy("disconnect")
	acc.log.Info().Str("peer", a.remoteAddr).Str("remote_node", node).Str("session", hsID).Int("qps", n).
		Msg("accepted rdma connection released by its requester")
	return &pegadv1.RdmaDisconnectResponse{QpsReleased: uint32(n)}, nil
}

// validateRequest checks everything in a handshake request that comes off
// the network before any resource is created.
func (acc *Acceptor) validateRequest(req *pegadv1.RdmaHandshakeRequest) ([]remoteNIC, error) {
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
	case req.GetTransport() != acc.nics.opts.Transport:
		return nil, fmt.Errorf("%w: transport %q, this node uses %q", ErrInvalidHandshake, truncate(req.GetTransport(), 32), acc.nics.opts.Transport)
	case len(req.GetNics()) == 0 || len(req.GetNics()) > maxNICs:
		return nil, fmt.Errorf("%w: %d nics (want 1..%d)", ErrInvalidHandshake, len(req.GetNics()), maxNICs)
	}
	out := make([]remoteNIC, len(req.GetNics()))
	total := 0
	for i, nh := range req.GetNics() {
		r, err := acc.nics.parseNIC(nh, false)
		if err != nil {
			return nil, fmt.Errorf("nic %d: %w", i, err)
		}
		total += len(r.endpoints)
		out[i] = r
	}
	if limit := acc.maxEndpoints(); total > limit {
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
			p.destroy(a.acc.nics)
		}
	}
}

// destroy tears an installed accepted connection down, once. The caller
// has already removed it from the map (or owns it exclusively).
func (a *acceptedConn) destroy(reason string) {
	a.once.Do(func() {
		// Counted before the QPs go: whoever sees the QP gauge fall sees
		// why (the disconnect tests read both).
		a.acc.met.Invalidations.WithLabelValues(reason).Inc()
		a.destroyQPs()
		state := StateConnected
		if a.retired { // removed from the maps already: no writer left
			state = StateInvalidated
		}
		a.acc.met.Conns.WithLabelValues(RoleHolder, state).Dec()
		a.acc.log.Debug().Str("peer", a.remoteAddr).Str("session", a.handshakeID).Str("reason", reason).Msg("accepted connection destroyed")
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
// (reason INVALID), a closed Acceptor Unavailable (DRAINING: the node is
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
func (acc *Acceptor) maxEndpoints() int {
	return max(minMaxEndpoints, len(acc.nics.curNICs())*maxQPsPerPeer)
}
