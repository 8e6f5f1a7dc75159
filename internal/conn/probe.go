package conn

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/ibv"
)

// The requester's keepalive. A one-sided READ is the only traffic an RC
// connection carries, so a holder that died while its requester was idle
// goes unnoticed until the next fetch fails: the connection stays listed
// as connected, with its QPs. The prober READs probeBytes from the start
// of the holder's memory on one QP of every NIC of each idle connection.
// A live holder's NIC answers without its CPU, in microseconds; a dead
// one's QPs are gone, so the READ fails with RETRY_EXC_ERR once the QP's
// retry budget is spent (ibv.ConnectAttr.RetryBudget). Not every provider
// gives up: soft-RoCE (rxe) treats retry_cnt 7 as "retry forever", so a
// probe also fails when it has not completed within the retry budget plus
// probeSlack. Either failure invalidates the connection as a failed fetch
// would: it leaves the listing, its QPs are destroyed (after the READ is
// flushed), and the next Get handshakes afresh.

// probeBytes is the length of one keepalive READ.
const probeBytes = 8

// probeSlack is added to the retry budget before an unanswered probe
// counts as a dead holder: room for a loaded host, far above a live
// NIC's answer.
const probeSlack = 500 * time.Millisecond

// registerProbe maps the scratch page keepalive READs land in and
// registers it on every NIC (localNIC.probeMR). Never the pool: a probe
// must not write where blocks live. Its contents are never read.
func (s *NICs) registerProbe() error {
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("conn: map keepalive buffer: %w", err)
	}
	s.probeMem = mem
	for _, n := range s.curNICs() {
		if n.probeMR, err = n.pd.RegMR(mem, ibv.AccessLocalWrite); err != nil {
			return fmt.Errorf("conn: register keepalive buffer on %s: %w", n.info.Name, err)
		}
	}
	return nil
}

// registerProbeTarget maps the page a requester's keepalive READs from a
// holder with memory windows (its pool is not readable without a lock)
// and registers it for remote read on every NIC. Zeros, never written:
// not the scratch page, where other holders' bytes land.
func (s *NICs) registerProbeTarget() error {
	mem, err := unix.Mmap(-1, 0, unix.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return fmt.Errorf("conn: map keepalive target: %w", err)
	}
	s.probeTarget = mem
	for _, n := range s.curNICs() {
		if err := s.registerProbeTargetOn(n); err != nil {
			return err
		}
	}
	return nil
}

func (s *NICs) registerProbeTargetOn(n *localNIC) (err error) {
	if s.probeTarget == nil {
		return nil
	}
	if n.probeTargetMR, err = n.pd.RegMR(s.probeTarget, ibv.AccessRemoteRead); err != nil {
		return fmt.Errorf("conn: register keepalive target on %s: %w", n.info.Name, err)
	}
	return nil
}

// probeRegion is what a handshake answer names as n's keepalive target:
// nil without memory windows (the pool's first bytes serve).
func (s *NICs) probeRegion(n *localNIC) *pegadv1.MemoryRegion {
	if n.probeTargetMR == nil {
		return nil
	}
	return &pegadv1.MemoryRegion{Base: n.probeTargetMR.Addr(), Length: n.probeTargetMR.Len(), Rkey: n.probeTargetMR.RKey()}
}

// releaseProbe deregisters and unmaps the scratch page (Close, or a failed
// NewNICs), before the NICs' protection domains close.
func (s *NICs) releaseProbe() {
	for _, n := range s.curNICs() {
		if n != nil && n.probeMR != nil {
			_ = n.probeMR.Dereg()
			n.probeMR = nil
		}
	}
	if s.probeMem != nil {
		_ = unix.Munmap(s.probeMem)
		s.probeMem = nil
	}
	if s.probeTarget != nil {
		_ = unix.Munmap(s.probeTarget)
		s.probeTarget = nil
	}
}

// prober probes idle requester connections every ProbeInterval. Owned by
// the dialer: started by NewDialer when ProbeInterval > 0, stopped by
// Close (d.ctx), counted in d.probing.
func (d *Dialer) prober() {
	defer d.probing.Done()
	tick(d.ctx, d.opts.ProbeInterval, d.probeIdle)
}

// probeIdle probes, one after the other, the connections that no Read has
// used for ProbeInterval. A dead holder costs one retry budget here, so a
// tick is at most that late per dead holder.
func (d *Dialer) probeIdle(now time.Time) {
	d.mu.Lock()
	idle := make([]*AddrConnection, 0, len(d.peers))
	for _, c := range d.peers {
		if c.idleFor(now, d.opts.ProbeInterval) {
			idle = append(idle, c)
		}
	}
	d.mu.Unlock()
	for _, c := range idle {
		ctx, cancel := context.WithTimeout(d.ctx, time.Duration(d.probeTimeout.Load()))
		err := c.probe(ctx)
		cancel()
		if err != nil && d.ctx.Err() == nil {
			c.log.Warn().Err(err).Msg("rdma keepalive failed: holder unreachable over RDMA, connection invalidated")
		}
	}
}

// idleFor reports whether no Read is in flight on c and none returned in
// the last d.
func (c *AddrConnection) idleFor(now time.Time, d time.Duration) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	last := c.lastUse
	if last.IsZero() {
		last = c.since
	}
	return !c.invalid && c.refs == 0 && now.Sub(last) >= d
}

// probe READs probeBytes from the start of the holder's probe page (or,
// from a holder that names none, its first region) on
// one QP of every NIC (the QPs taking turns). nil when every READ
// completed, or c was invalidated meanwhile; a failure has invalidated c.
func (c *AddrConnection) probe(ctx context.Context) error {
	if c.d.nics.probeMem == nil {
		return nil
	}
	local := uint64(uintptr(unsafe.Pointer(&c.d.nics.probeMem[0])))
	if c.acquire() != nil {
		return nil // invalidated meanwhile: nothing left to watch
	}
	defer c.release()
	var batches []*batch
	for _, cn := range c.nics {
		if len(cn.remote) == 0 || len(cn.sessions) == 0 || cn.nic.probeMR == nil {
			continue
		}
		r := cn.remote[0]
		if cn.probe.Length > 0 {
			r = cn.probe // a holder with memory windows: its pool reads nothing
		}
		s := cn.sessions[cn.rr.Add(1)%uint64(len(cn.sessions))]
		batches = append(batches, &batch{s: s, ops: []int{0}, wrs: []ibv.SendWR{{
			Op: ibv.OpRDMARead, Signaled: true,
			LocalAddr: local, Length: uint32(min(probeBytes, r.Length)), LKey: cn.nic.probeMR.LKey(),
			RemoteAddr: r.Base, RKey: r.RKey,
		}}})
	}
	if len(batches) == 0 {
		return nil
	}
	return c.runBatches(ctx, batches)
}
