package conn

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/ibv"
)

// NIC choice and pairing: which local NIC carries each READ (pickNIC),
// which of the holder's NICs each requester NIC talks to (pairNICs), and
// the NIC metadata a handshake carries for that (link layer, subnet,
// responder resources).

// Cost per byte of a READ on a NIC, in quarters: a NIC on another NUMA
// node than the segment costs 5/4 of a local one, so local NICs carry
// about 1.25x the bytes of remote ones and none sits idle (a node's
// bandwidth is all its NICs, not the half on one socket).
const (
	localNICCost  = 4
	remoteNICCost = 5
)

// pickNIC chooses the NIC for n more bytes of a READ into local memory on
// NUMA node local from a segment on the peer's node numa (either -1:
// unknown). Only NICs on local's node are candidates when it has any: a
// NIC writes fastest into memory on its own socket, and StagingPlan
// spreads a fetch's staging over the nodes so that every NIC gets its
// share (when none of c's NICs is on local's node, a rail there being
// down, every NIC is). Among candidates, the one whose bytes in flight,
// those already planned in this plan (pending, indexed like c.nics) and
// this chunk included, cost least wins, the scan starting at a rotating
// index so ties spread. It returns the NIC's index and adds n to pending only: the plan
// commits its bytes (commitNICBytes) once nothing in it can fail, so a
// plan rejected halfway (ErrRemoteMemory) leaves no phantom bytes that
// would starve that NIC.
//
// With a grant (memory windows), only the NICs it serves are candidates,
// on any node when none of them is on local's; -1 when it serves none.
func (c *AddrConnection) pickNIC(numa, local int, n uint64, pending []uint64, g *Grant) int {
	if local >= 0 && !c.d.nics.hasNICOn(local) {
		local = -1 // memory on a node without NICs: any NIC
	}
	if local >= 0 && !c.usesNode(local) {
		local = -1
	}
	if local >= 0 && g != nil && !c.grantServesNode(g, local) {
		local = -1
	}
	start := int(c.rr.Add(1) % uint64(len(c.nics)))
	best := -1
	var bestCost uint64
	for i := range c.nics {
		j := (start + i) % len(c.nics)
		cn := c.nics[j]
		nn := cn.nic.info.NUMANode
		if local >= 0 && nn != local || g != nil && !g.has(j) {
			continue
		}
		w := uint64(localNICCost)
		if numa >= 0 && nn >= 0 && nn != numa {
			w = remoteNICCost
		}
		if cost := (cn.bytes.Load() + pending[j] + n) * w; best < 0 || cost < bestCost {
			best, bestCost = j, cost
		}
	}
	if best >= 0 {
		pending[best] += n
	}
	return best
}

// grantServesNode reports whether g serves a NIC of c on NUMA node node.
func (c *AddrConnection) grantServesNode(g *Grant, node int) bool {
	for j, cn := range c.nics {
		if cn.nic.info.NUMANode == node && g.has(j) {
			return true
		}
	}
	return false
}

// placedNUMA reports whether READs should go through NICs on their local
// memory's node: the NICs are on two or more known nodes and the memory has
// a part on each of them (else some NICs would never carry a READ; a pool
// whose binding failed ends up so, and then spreading over all NICs beats
// leaving some idle).
func placedNUMA(nics []*localNIC, pl Placement) bool {
	if pl == nil {
		return false
	}
	memNodes := pl.Nodes()
	var nicNodes []int
	for _, n := range nics {
		node := n.info.NUMANode
		if node < 0 || !slices.Contains(memNodes, node) {
			return false
		}
		if !slices.Contains(nicNodes, node) {
			nicNodes = append(nicNodes, node)
		}
	}
	return len(nicNodes) >= 2
}

// usesNode reports whether one of c's NICs is on NUMA node node.
func (c *AddrConnection) usesNode(node int) bool {
	for _, cn := range c.nics {
		if cn.nic.info.NUMANode == node {
			return true
		}
	}
	return false
}

// hasNICOn reports whether a local NIC is on NUMA node node.
func (s *NICs) hasNICOn(node int) bool {
	for _, n := range s.curNICs() {
		if n.info.NUMANode == node {
			return true
		}
	}
	return false
}

// StagingPlan spreads one fetch's staging over the local NUMA nodes that
// have NICs, so that the READs into it (each carried by a NIC on its
// staging's node, pickNIC) keep every NIC busy. Not safe for concurrent
// use: one fetch places its blocks in order.
type StagingPlan struct {
	nodes []int
	nics  []uint64 // NICs on nodes[i]
	bytes []uint64 // the connection's READ bytes in flight on nodes[i], plus those placed
	start int      // where ties start: rotates per plan
}

// StagingPlan starts placing a fetch's staging; nil when READs are not
// placed by NUMA node (see NICOptions.Placement): then it does not matter.
func (c *AddrConnection) StagingPlan() *StagingPlan {
	if !c.d.nics.placed {
		return nil
	}
	sp := &StagingPlan{}
	for _, cn := range c.nics {
		node := cn.nic.info.NUMANode
		if node < 0 {
			continue
		}
		i := slices.Index(sp.nodes, node)
		if i < 0 {
			i = len(sp.nodes)
			sp.nodes = append(sp.nodes, node)
			sp.nics = append(sp.nics, 0)
			sp.bytes = append(sp.bytes, 0)
		}
		sp.nics[i]++
		sp.bytes[i] += cn.bytes.Load()
	}
	if len(sp.nodes) < 2 {
		return nil
	}
	sp.start = int(c.rr.Add(1) % uint64(len(sp.nodes)))
	return sp
}

// Place chooses the local node for n bytes of staging whose source is on
// the peer's node remote (-1 unknown): the node whose bytes per NIC, these
// included, cost least, a node other than remote costing 5/4 as pickNIC
// weighs a remote NIC (hosts are alike: the peer's NICs for remote are on
// remote).
func (sp *StagingPlan) Place(remote int, n uint64) int {
	best := -1
	var bestCost float64
	for k := range sp.nodes {
		i := (sp.start + k) % len(sp.nodes)
		w := float64(localNICCost)
		if remote >= 0 && sp.nodes[i] != remote {
			w = remoteNICCost
		}
		if cost := float64(sp.bytes[i]+n) * w / float64(sp.nics[i]); best < 0 || cost < bestCost {
			best, bestCost = i, cost
		}
	}
	sp.bytes[best] += n
	return sp.nodes[best]
}

// commitNICBytes adds a successful plan's bytes to each NIC's bytes in
// flight and its read-bytes counter.
func (c *AddrConnection) commitNICBytes(pending []uint64) {
	for i, n := range pending {
		if n > 0 {
			c.nics[i].bytes.Add(n)
			c.nics[i].nic.readBytes.Add(float64(n))
		}
	}
}

// settleNICBytes takes a finished Read's bytes (commitNICBytes) out of its
// NICs' bytes in flight: placement balances what each NIC has outstanding,
// so a slow rail, still busy with earlier READs, gets fewer new ones
// instead of an equal share that would gate every fetch.
func (c *AddrConnection) settleNICBytes(pending []uint64) {
	for i, n := range pending {
		if n > 0 {
			c.nics[i].bytes.Add(-n)
		}
	}
}

// nicSubnet is the subnet a handshake names for a NIC, which pairs it with
// the peer's NIC on the same rail: an IPv4 RoCE GID's /24, else the GID's
// upper 64 bits (the InfiniBand subnet prefix, a RoCE IPv6 /64). Empty
// when it says nothing (no GID; a link-local RoCE GID is the same
// fe80::/64 on every rail).
func nicSubnet(info ibv.DeviceInfo) string {
	g := info.GID
	if g == (ibv.GID{}) {
		return ""
	}
	addr := netip.AddrFrom16(g)
	if addr.Is4In6() {
		p, _ := addr.Unmap().Prefix(24)
		return p.String()
	}
	if info.LinkLayer == "Ethernet" && addr.IsLinkLocalUnicast() {
		return ""
	}
	p, _ := addr.Prefix(64)
	return p.String()
}

// currentSubnet is the subnet handshakes name for n now (see
// localNIC.subnet).
func (n *localNIC) currentSubnet() string {
	if s := n.subnet.Load(); s != nil {
		return *s
	}
	return nicSubnet(n.info)
}

// refreshSubnet takes n's subnet from its device as resolved now; it
// reports the old and new subnet.
func (n *localNIC) refreshSubnet() (before, after string) {
	before = n.currentSubnet()
	after = nicSubnet(n.dev.Info())
	n.subnet.Store(&after)
	return before, after
}

// nicMatch is how well a holder NIC fits a requester NIC.
type nicMatch int

const (
	matchPosition nicMatch = iota // nothing in common: paired by position
	matchName                     // same device name
	matchSubnet                   // same link layer and subnet: the same rail
	matchRail                     // the same rail, as the operators named it (--nics RAIL=DEV)
)

// pairNICs chooses, for each requester NIC, the local NIC (whose port is
// up) it talks to:
// the same named rail first, then the same link layer and subnet, then the
// same name, then position (logged as a warning: on a rail-isolated fabric
// such a pair connects and then its READs time out). Among equals the least
// used local NIC wins, then the one at the requester NIC's position.
func (s *NICs) pairNICs(req []remoteNIC, log zerolog.Logger) []*localNIC {
	nics := s.curNICs()
	uses := make([]int, len(nics))
	out := make([]*localNIC, len(req))
	var byPosition []string
	// A NIC whose port is down is paired with nothing while another is up
	// (rail.go): the requester's READs through it would never complete.
	skipDown := len(s.upNICs()) > 0
	for i, r := range req {
		best, bestMatch := -1, matchPosition
		for j, n := range nics {
			if n.fatal.Load() || skipDown && n.down.Load() {
				continue // a dead device's NIC never (it is being replaced)
			}
			mt := matchPosition
			switch {
			case r.rail != "" && r.rail == n.rail:
				mt = matchRail
			case r.subnet != "" && r.linkLayer == n.info.LinkLayer && r.subnet == n.currentSubnet():
				mt = matchSubnet
			case r.name != "" && r.name == n.info.Name:
				mt = matchName
			}
			if best < 0 || mt > bestMatch || (mt == bestMatch && (uses[j] < uses[best] ||
				(uses[j] == uses[best] && j == i%len(nics)))) {
				best, bestMatch = j, mt
			}
		}
		if best < 0 {
			return nil // every NIC's device is dead
		}
		uses[best]++
		out[i] = nics[best]
		if bestMatch == matchPosition {
			byPosition = append(byPosition, fmt.Sprintf("%s(%s %s %s)->%s(%s %s %s)", r.name, r.rail, r.linkLayer, r.subnet,
				nics[best].info.Name, nics[best].rail, nics[best].info.LinkLayer, nics[best].currentSubnet()))
		}
	}
	if len(byPosition) > 0 && s.opts.Transport != "tcp" {
		log.Warn().Str("pairs", strings.Join(byPosition, ", ")).
			Msg("NICs paired by position: no local NIC shares their rail, subnet or name; on a rail-isolated fabric their READs will fail")
	}
	return out
}

// localEndpoint is what a handshake sends for one local QP: its endpoint
// with the responder resources the QP gets (the configured read depth,
// capped by the device), so the peer's initiator depth stays within them.
func (s *NICs) localEndpoint(p *qpPair) ibv.Endpoint {
	ep := p.qp.Endpoint()
	n := s.connectAttr(p.nic).MaxDestRd
	if ep.MaxDestRd == 0 || n < ep.MaxDestRd {
		ep.MaxDestRd = n
	}
	return ep
}

// registerNICs opens a PD on every device and registers the pool on it, all
// devices at once: pinning a large pool takes seconds per NIC in the kernel,
// and eight NICs in sequence can outlast systemd's start timeout. Every
// localNIC is in s.curNICs(), in device order, whatever fails (releaseNICs frees
// what was made). The error names the first NIC, in order, that failed.
func (s *NICs) registerNICs(opts NICOptions) error {
	nics := make([]*localNIC, len(opts.Devices))
	errs := make([]error, len(opts.Devices))
	var wg sync.WaitGroup
	for i, dev := range opts.Devices {
		n := s.newLocalNIC(dev, i)
		n.up.Set(1)
		nics[i] = n
		wg.Go(func() { errs[i] = s.registerNIC(n) })
	}
	wg.Wait()
	s.nicSet.Store(&nics) // whatever failed: releaseNICs frees what was made
	return errors.Join(errs...)
}

// newLocalNIC is the NIC of dev at position i of NICOptions.Devices, not
// registered yet (nor counted up: its caller does once it is placed).
func (s *NICs) newLocalNIC(dev ibv.Device, i int) *localNIC {
	n := &localNIC{dev: dev, info: dev.Info(), pos: i, win: newWindowWaiters()}
	if s.opts.Rails != nil {
		n.rail = s.opts.Rails[i]
	}
	subnet := nicSubnet(n.info)
	n.subnet.Store(&subnet)
	n.readBytes = s.met.NICReadBytes.WithLabelValues(n.info.Name) // at 0 from the start
	n.up = s.met.NICUp.WithLabelValues(n.info.Name)
	n.windows = s.met.MemoryWindows.WithLabelValues(n.info.Name)
	return n
}

// registerNIC allocates n's PD and registers the pool on it (remote reads
// only through memory windows when they are on).
func (s *NICs) registerNIC(n *localNIC) error {
	access := ibv.AccessLocalWrite | ibv.AccessRemoteRead | ibv.AccessRelaxedOrdering
	if s.windows { // remote reads only through the windows of a lock
		access = ibv.AccessLocalWrite | ibv.AccessMWBind | ibv.AccessRelaxedOrdering
	}
	if s.opts.NoRelaxedOrdering {
		access &^= ibv.AccessRelaxedOrdering
	}
	pd, err := n.dev.AllocPD()
	if err != nil {
		return fmt.Errorf("conn: alloc pd on %s: %w", n.info.Name, err)
	}
	n.pd = pd
	if n.mr, err = pd.RegMR(s.opts.Memory, access); err != nil {
		return fmt.Errorf("conn: register memory on %s: %w", n.info.Name, err)
	}
	return nil
}

// watchNICEvents follows the asynchronous port events of every NIC that
// reports them, until Close: each is logged and counted; a port that went
// down invalidates every requester connection (each has QPs on every NIC,
// and an RC QP through a dead port never recovers), so the next Get
// handshakes afresh. An address change (or port up) refreshes the subnet
// handshakes name for the NIC: the device re-resolved its GID, and the QPs
// of the next handshake use it.
func (s *NICs) watchNICEvents() {
	for _, n := range s.curNICs() {
		s.watchNIC(n)
	}
}

// watchNIC follows n's events (watchNICEvents), until Close or its device
// closes.
func (s *NICs) watchNIC(n *localNIC) {
	// Every NIC's event series exist from the start, at 0.
	for _, k := range []ibv.DeviceEventKind{ibv.PortDown, ibv.PortUp, ibv.AddressChange, ibv.DeviceFatal} {
		s.met.NICEvents.WithLabelValues(n.info.Name, k.String())
	}
	ed, ok := n.dev.(ibv.EventDevice)
	if !ok {
		return
	}
	evs := ed.Events()
	s.nicEvents.Go(func() {
		for {
			select {
			case <-s.ctx.Done():
				return
			case ev, ok := <-evs:
				if !ok {
					return
				}
				s.onNICEvent(n, ev)
			}
		}
	})
}

func (s *NICs) onNICEvent(n *localNIC, ev ibv.DeviceEvent) {
	name := n.info.Name
	log := s.log.With().Str("nic", name).Str("event", ev.Kind.String()).Logger()
	if n.fatal.Load() {
		return // a dead context's last words: its reopened NIC has its own
	}
	switch ev.Kind {
	case ibv.DeviceFatal:
		s.met.NICEvents.WithLabelValues(name, ev.Kind.String()).Inc()
		s.deviceFatal(n, log)
		return
	case ibv.PortDown:
		s.met.NICEvents.WithLabelValues(name, ev.Kind.String()).Inc()
		s.railDown(n, log)
		return
	case ibv.PortUp:
		defer s.railUp(n, log)
	}
	// The device re-resolved its GID: later handshakes name the subnet it
	// is in now, so the peer pairs this NIC by its rail. Counted after, so
	// a count seen means the subnet is current.
	before, after := n.refreshSubnet()
	s.met.NICEvents.WithLabelValues(name, ev.Kind.String()).Inc()
	log.Info().Int("gid_index", ev.Info.GIDIndex).Uint16("lid", ev.Info.LID).
		Str("subnet", after).Str("old_subnet", before).Msg("nic port event")
}
