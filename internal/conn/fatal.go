package conn

import (
	"errors"
	"fmt"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/ibv"
)

// A fatal device is closed and reopened. IBV_EVENT_DEVICE_FATAL (a
// firmware reset, a PCIe error) kills every object of the device's context:
// its QPs, CQs, MRs and PD. The NIC is taken out of placement as for a
// port down (rail.go), for good: its QPs are flushed and the connections
// through it invalidated, so fetches go on over the other NICs. A reopen
// loop then opens the device again (NICOptions.Reopen) until it is back,
// registers the pool on it and puts the new NIC in the dead one's place;
// the connections made without it are replaced. The dead NIC is retired
// once the last QP and memory window made on it are gone: its holder CQ,
// MRs and PD are released then (destroying them earlier would pull them
// from under a QP still being torn down).

const (
	reopenFirst = 200 * time.Millisecond
	reopenMax   = 5 * time.Second
)

// ErrNICReleased: a QP or window was to be made on a dead NIC already
// released (a handshake that paired it just before the swap).
var ErrNICReleased = errors.New("conn: nic released after device fatal")

// acquireUse admits one more QP or window on n, unless n was released:
// on true the caller holds n's life lock shared until endUse (made: it
// stays counted in users until destroyed) or releaseUse (failed).
func (n *localNIC) acquireUse() bool {
	n.life.RLock()
	if n.released.Load() {
		n.life.RUnlock()
		return false
	}
	n.users.Add(1)
	return true
}

func (n *localNIC) endUse() { n.life.RUnlock() }

func (n *localNIC) releaseUse() {
	n.users.Add(-1)
	n.life.RUnlock()
}

// curNICs is the current NICs, by position in NICOptions.Devices.
func (s *NICs) curNICs() []*localNIC {
	if p := s.nicSet.Load(); p != nil {
		return *p
	}
	return nil
}

// deviceFatal takes n out of placement for good and starts reopening it.
func (s *NICs) deviceFatal(n *localNIC, log zerolog.Logger) {
	if n.fatal.Swap(true) {
		return
	}
	log.Error().Msg("nic device fatal: out of placement; reopening it")
	s.railDown(n, log)
	if s.opts.Reopen == nil {
		log.Error().Msg("nic device fatal and no way to reopen it: it stays out until restart")
		return
	}
	// Close waits for the loop; begin refuses once it has started.
	if s.begin(&s.reopening) != nil {
		return
	}
	go func() {
		defer s.reopening.Done()
		s.reopenLoop(n, log)
	}()
}

// reopenLoop opens n's device again until it works or the NIC set closes,
// then swaps the new NIC in and retires n.
func (s *NICs) reopenLoop(n *localNIC, log zerolog.Logger) {
	wait := reopenFirst
	for attempt := 1; ; attempt++ {
		select {
		case <-s.ctx.Done():
			s.retire(n, log)
			return
		case <-time.After(wait):
		}
		nn, err := s.reopen(n)
		if err == nil {
			s.swapNIC(n, nn, log, attempt)
			s.retire(n, log)
			return
		}
		log.Warn().Err(err).Int("attempt", attempt).Msg("nic reopen failed; trying again")
		wait = min(2*wait, reopenMax)
	}
}

// reopen opens n's device afresh and registers the pool on it (and the
// keepalive page); nothing is left open on error.
func (s *NICs) reopen(n *localNIC) (*localNIC, error) {
	dev, err := s.opts.Reopen(n.pos)
	if err != nil {
		return nil, err
	}
	if ps, ok := dev.(ibv.PortStater); ok {
		if active, err := ps.PortActive(); err != nil || !active {
			_ = dev.Close()
			return nil, fmt.Errorf("reopened %s: port not active (%v)", n.info.Name, err)
		}
	}
	nn := s.newLocalNIC(dev, n.pos)
	nn.ownDev = true
	err = s.registerNIC(nn)
	if err == nil && s.probeMem != nil {
		if nn.probeMR, err = nn.pd.RegMR(s.probeMem, ibv.AccessLocalWrite); err != nil {
			err = fmt.Errorf("conn: register keepalive buffer on %s: %w", nn.info.Name, err)
		}
	}
	if err == nil {
		err = s.registerProbeTargetOn(nn)
	}
	if err != nil {
		s.releaseNIC(nn)
		return nil, err
	}
	return nn, nil
}

// swapNIC puts nn in old's place and replaces the requester connections
// made without it, as a port coming back does.
func (s *NICs) swapNIC(old, nn *localNIC, log zerolog.Logger, attempts int) {
	s.mu.Lock()
	cur := s.curNICs()
	next := make([]*localNIC, len(cur))
	copy(next, cur)
	next[old.pos] = nn
	s.nicSet.Store(&next)
	s.mu.Unlock()
	nn.up.Set(1)
	s.watchNIC(nn)
	d := s.dialer.Load()
	var stale []*AddrConnection
	for _, c := range d.requesterConns() {
		if !c.uses(nn) {
			stale = append(stale, c)
		}
	}
	log.Info().Int("attempts", attempts).Int("replaced", len(stale)).Msg("nic reopened after device fatal: back in placement")
	for _, c := range stale {
		d.Invalidate(c, fmt.Errorf("%s was reopened: reconnect over every NIC", nn.info.Name))
	}
}

// retire waits for the last QP and window made on dead NIC n to go (the
// connections through it were invalidated; a holder's go when their
// requesters reconnect or are reaped), then releases it. Once the NIC set
// closes, Close has destroyed every QP: it waits at most drainTimeout more.
func (s *NICs) retire(n *localNIC, log zerolog.Logger) {
	done := s.ctx.Done()
	var closing <-chan time.Time
	for !s.releaseIdle(n) {
		select {
		case <-done:
			done = nil // once: a closed channel would spin this loop
			closing = time.After(s.drainTimeout)
		case <-closing:
			log.Error().Int64("users", n.users.Load()).Msg("dead nic still has QPs or windows at close: released anyway")
			s.releaseNIC(n)
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
	log.Info().Msg("dead nic released")
}

// releaseIdle releases n if nothing is made on it; false when something
// still is (or is being made).
func (s *NICs) releaseIdle(n *localNIC) bool {
	n.life.Lock()
	idle := n.users.Load() == 0
	n.life.Unlock()
	if idle {
		s.releaseNIC(n)
	}
	return idle
}

// releaseNIC frees n's holder CQ, keepalive and pool registrations, PD and,
// when the NIC set opened it, its device. Errors of a dead device are
// expected and ignored.
func (s *NICs) releaseNIC(n *localNIC) {
	n.life.Lock()
	defer n.life.Unlock()
	if n.released.Swap(true) {
		return
	}
	s.releaseStuck(n) // before the MR they are bound over
	n.holdMu.Lock()
	if n.holdCQ != nil {
		if err := n.holdCQ.Close(); err != nil && !n.fatal.Load() {
			s.log.Warn().Err(err).Str("nic", n.info.Name).Msg("close holder cq")
		}
		n.holdCQ = nil
	}
	n.holdMu.Unlock()
	if n.probeMR != nil {
		_ = n.probeMR.Dereg()
		n.probeMR = nil
	}
	if n.probeTargetMR != nil {
		_ = n.probeTargetMR.Dereg()
		n.probeTargetMR = nil
	}
	if n.mr != nil {
		_ = n.mr.Dereg()
		n.mr = nil
	}
	if n.pd != nil {
		_ = n.pd.Close()
		n.pd = nil
	}
	if n.ownDev {
		_ = n.dev.Close()
	}
}
