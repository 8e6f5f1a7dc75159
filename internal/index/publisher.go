package index

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// Source is what the publisher reads of the local store: the truth it
// publishes. *store.Store satisfies it through StoreSource.
type Source interface {
	Has(store.Key) bool // held, in any tier
	Keys() []store.Key  // every key held (a full republication)
}

// MediumSource is a Source that says where it holds a key; the publisher
// announces each key with its medium. Without it every key is announced
// as MediumDRAM.
type MediumSource interface {
	Source
	Medium(store.Key) Medium // of a key Has reports held
}

// KeyLister lists what a lower tier holds (ssd.Tier).
type KeyLister interface {
	Keys() []store.Key
}

// StoreSource adapts a store, and the SSD tier under it when Lower is
// set, to MediumSource: a key in the pool is announced as DRAM, one only
// on the tier as SSD.
type StoreSource struct {
	S     *store.Store
	Lower KeyLister // nil without an SSD tier
}

var _ MediumSource = StoreSource{}

// Has reports whether the pool or the SSD tier holds k.
func (s StoreSource) Has(k store.Key) bool { return s.S.Has(k) || s.S.OnLower(k) }

// Medium says where k is: the pool first.
func (s StoreSource) Medium(k store.Key) Medium {
	if s.S.Has(k) {
		return MediumDRAM
	}
	return MediumSSD
}

// Keys lists every key of the pool, then those only on the SSD tier.
func (s StoreSource) Keys() []store.Key {
	keys := s.S.Keys()
	if s.Lower != nil {
		for _, k := range s.Lower.Keys() {
			if !s.S.Has(k) {
				keys = append(keys, k)
			}
		}
	}
	return keys
}

// Defaults of PublisherOptions left zero.
const (
	DefaultBatchDelay = 20 * time.Millisecond
	DefaultMaxBatch   = 1024
	// opTimeout bounds one round trip of registration or publication.
	opTimeout = 5 * time.Second
)

// PublisherOptions configure a Publisher.
type PublisherOptions struct {
	Index  Index
	Source Source
	// Self returns this node's record as of now (free bytes change).
	Self func() Node
	// TTL of the membership record; it is refreshed every TTL/3.
	TTL time.Duration
	// BatchDelay is how long a change waits for others to share its
	// round trip (0: DefaultBatchDelay); MaxBatch caps one pipeline.
	BatchDelay time.Duration
	MaxBatch   int
	Metrics    *metrics.Cluster // required
	Log        zerolog.Logger
}

// Publisher keeps this node's membership record alive and its block
// entries in step with the store. It is fed by Notify (the store's change
// subscriber) and runs as one goroutine owned by the daemon (Run).
//
// Any failure to write (the index down, a timeout) makes it republish
// everything once the index answers again, rather than remember which
// writes were lost: the store, not a log of changes, is the truth, so a
// resync converges whatever the index forgot (a restart with no data
// included).
type Publisher struct {
	o    PublisherOptions
	wake chan struct{} // cap 1: a change is waiting
	kick chan struct{} // cap 1: keepalive asks for a republication

	leave     chan struct{} // closed by Leave: Run deregisters and returns
	leaveOnce sync.Once
	left      chan struct{} // closed when Run has returned (record removed, best effort)
	// leaving: Leave was called. Read by every loop, so that nothing is
	// published or refreshed after it, whatever select picks first.
	leaving atomic.Bool

	mu     sync.Mutex // guards dirty, oldest, resync
	dirty  map[store.Key]struct{}
	oldest time.Time // when the oldest unpublished change arrived
	// resync: a full republication is due; changes are not tracked
	// meanwhile (the resync reads the store).
	resync bool

	// up: the last heartbeat reached the index. Written by keepalive,
	// read by the publishing loop.
	up atomic.Bool
	// Owned by keepalive's goroutine. lostRun counts consecutive
	// heartbeats that found the record gone: a real loss is healed by the
	// next heartbeat, so a run of them means another process registers
	// under this node id. everUp: some heartbeat succeeded (logs).
	lostRun int
	everUp  bool
}

// NewPublisher makes a publisher; nothing runs before Run. o.Metrics is
// required.
func NewPublisher(o PublisherOptions) (*Publisher, error) {
	if o.Metrics == nil {
		return nil, errors.New("index: publisher: Metrics is required")
	}
	if o.BatchDelay <= 0 {
		o.BatchDelay = DefaultBatchDelay
	}
	if o.MaxBatch <= 0 {
		o.MaxBatch = DefaultMaxBatch
	}
	return &Publisher{o: o, wake: make(chan struct{}, 1), kick: make(chan struct{}, 1),
		leave: make(chan struct{}), left: make(chan struct{}),
		dirty: make(map[store.Key]struct{}), resync: true}, nil
}

// Leave takes this node out of the index as a drain begins: Run stops
// refreshing the record and publishing, removes the record and returns,
// so requesters stop choosing this node now instead of when the drain
// ends (its blocks are still served to sessions already granted). Leave
// waits for that, or for ctx; it returns at once when Run has returned.
func (p *Publisher) Leave(ctx context.Context) {
	p.leaveOnce.Do(func() {
		p.leaving.Store(true) // stop tracking changes: nothing publishes them now
		p.mu.Lock()
		clear(p.dirty)
		p.mu.Unlock()
		close(p.leave)
	})
	select {
	case <-p.left:
	case <-ctx.Done():
	}
}

// Notify records that k changed in the store. It never blocks.
func (p *Publisher) Notify(k store.Key) {
	if p.leaving.Load() {
		return
	}
	p.mu.Lock()
	if p.resync {
		p.mu.Unlock()
		return
	}
	if len(p.dirty) == 0 {
		p.oldest = time.Now()
	}
	p.dirty[k] = struct{}{}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run registers this node, publishes its blocks and keeps both fresh
// until ctx ends or Leave is called, then removes its record (best
// effort). Call it once.
//
// Two loops: keepalive refreshes the record every TTL/3 on its own, so a
// long republication (a million blocks take seconds) never lets the
// record lapse; the publishing loop batches changes and runs the
// republications keepalive asks for.
func (p *Publisher) Run(ctx context.Context) {
	kctx, stopKeepalive := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() {
		// Keepalive has stopped before the record goes: no heartbeat
		// can put it back.
		stopKeepalive()
		wg.Wait()
		p.deregister()
		close(p.left)
	}()
	wg.Go(func() { p.keepalive(kctx) })
	t := time.NewTicker(p.every())
	defer t.Stop()
	for {
		// Leave first: select picks at random among ready cases, and a
		// tick or kick ready beside it would republish everything first.
		select {
		case <-p.leave:
			p.o.Log.Info().Msg("Cluster index: leaving (drain): requesters stop choosing this node")
			return
		default:
		}
		select {
		case <-ctx.Done():
			return
		case <-p.leave:
			continue // said above
		case <-t.C:
			p.sync(ctx)
		case <-p.kick:
			p.sync(ctx)
		case <-p.wake:
			delay := time.NewTimer(p.o.BatchDelay)
			select {
			case <-ctx.Done():
				delay.Stop()
				return
			case <-delay.C:
			}
			p.flush(ctx)
		}
	}
}

func (p *Publisher) every() time.Duration { return max(p.o.TTL/3, 10*time.Millisecond) }

// sync republishes when one is due and the index answers, else flushes
// what a missed wake-up left behind.
func (p *Publisher) sync(ctx context.Context) {
	if p.leaving.Load() {
		return
	}
	p.mu.Lock()
	due := p.resync
	p.mu.Unlock()
	if !due {
		p.flush(ctx)
		return
	}
	if p.up.Load() {
		_ = p.republish(ctx)
	}
}

// keepalive registers at once and then every TTL/3 until ctx ends.
func (p *Publisher) keepalive(ctx context.Context) {
	t := time.NewTicker(p.every())
	defer t.Stop()
	for {
		p.heartbeat(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// heartbeat refreshes the record; a lost record (or an error) makes a
// republication due, which it asks the publishing loop for.
func (p *Publisher) heartbeat(ctx context.Context) {
	if p.leaving.Load() {
		return // Run removes the record: refreshing it would keep this node choosable
	}
	octx, cancel := context.WithTimeout(ctx, opTimeout)
	lost, err := p.o.Index.Register(octx, p.o.Self())
	cancel()
	wasUp := p.up.Swap(err == nil)
	switch {
	case err != nil && wasUp && ctx.Err() == nil:
		p.o.Log.Warn().Err(err).Msg("Cluster index unreachable: serving on, will register again when it answers")
	case err == nil && !wasUp && p.everUp:
		p.o.Log.Info().Msg("Cluster index reachable again: registering and republishing")
	}
	if err != nil {
		if ctx.Err() == nil {
			p.o.Metrics.PublishErrors.Inc()
		}
		p.markResync()
		return
	}
	p.everUp = true
	if lost {
		p.lostRun++
		if p.lostRun == 3 {
			p.o.Log.Warn().Int("heartbeats", p.lostRun).
				Msg("Cluster index: this node's record keeps being replaced: is another pegad running with the same --node-id?")
		}
		p.markResync()
	} else {
		p.lostRun = 0
	}
	p.mu.Lock()
	due := p.resync
	p.mu.Unlock()
	if due {
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

func (p *Publisher) markResync() {
	p.mu.Lock()
	p.resync = true
	clear(p.dirty)
	p.mu.Unlock()
}

// republish clears this node's entries and announces every stored block.
func (p *Publisher) republish(ctx context.Context) error {
	p.mu.Lock()
	// From here on, changes are tracked again: one that lands after the
	// snapshot below is published by the next flush.
	p.resync = false
	clear(p.dirty)
	p.mu.Unlock()
	start := time.Now()
	// No overall deadline: a reset of a million entries takes seconds;
	// each round trip has the backend's own I/O timeout, and ctx ends at
	// shutdown.
	err := p.o.Index.Reset(ctx)
	if err == nil {
		keys := p.o.Source.Keys()
		err = p.write(ctx, p.byMedium(keys), nil)
		if err == nil {
			p.o.Metrics.Resyncs.Inc()
			p.o.Log.Debug().Int("blocks", len(keys)).Dur("took", time.Since(start)).Msg("Cluster index: republished this node's blocks")
		}
	}
	if err != nil && !errors.Is(err, errLeaving) {
		p.o.Metrics.PublishErrors.Inc()
		p.markResync()
	}
	return err
}

// flush publishes the changes noted since the last flush: each key as the
// store has it now (present: announce; gone: withdraw).
func (p *Publisher) flush(ctx context.Context) {
	p.mu.Lock()
	if p.resync || len(p.dirty) == 0 {
		p.mu.Unlock()
		return
	}
	keys := make([]store.Key, 0, len(p.dirty))
	for k := range p.dirty {
		keys = append(keys, k)
	}
	clear(p.dirty)
	oldest := p.oldest
	p.mu.Unlock()

	var add, del []store.Key
	for _, k := range keys {
		if p.o.Source.Has(k) {
			add = append(add, k)
		} else {
			del = append(del, k)
		}
	}
	if err := p.write(ctx, p.byMedium(add), del); errors.Is(err, errLeaving) {
		return
	} else if err != nil {
		p.o.Metrics.PublishErrors.Inc()
		p.markResync()
		return
	}
	p.o.Metrics.PublishLag.Observe(time.Since(oldest).Seconds())
}

// errLeaving: a write stopped because Leave was called.
var errLeaving = errors.New("leaving the cluster index")

// byMedium splits keys by where the source holds them (DRAM first).
func (p *Publisher) byMedium(keys []store.Key) [2][]store.Key {
	ms, ok := p.o.Source.(MediumSource)
	if !ok {
		return [2][]store.Key{keys, nil}
	}
	var out [2][]store.Key
	for _, k := range keys {
		if ms.Medium(k) == MediumSSD {
			out[1] = append(out[1], k)
		} else {
			out[0] = append(out[0], k)
		}
	}
	return out
}

// write announces add (DRAM, then SSD) and withdraws del in pipelines of
// MaxBatch; it stops between pipelines once Leave was called (a
// republication of a million blocks would otherwise outlast Leave's
// wait).
func (p *Publisher) write(ctx context.Context, add [2][]store.Key, del []store.Key) error {
	announce := func(m Medium) func(context.Context, []store.Key) error {
		return func(ctx context.Context, keys []store.Key) error { return p.o.Index.Announce(ctx, m, keys) }
	}
	for _, job := range []struct {
		keys []store.Key
		op   string
		fn   func(context.Context, []store.Key) error
	}{
		{add[0], metrics.PublishAnnounce, announce(MediumDRAM)},
		{add[1], metrics.PublishAnnounce, announce(MediumSSD)},
		{del, metrics.PublishWithdraw, p.o.Index.Withdraw},
	} {
		for len(job.keys) > 0 {
			if p.leaving.Load() {
				return errLeaving
			}
			n := min(len(job.keys), p.o.MaxBatch)
			octx, cancel := context.WithTimeout(ctx, opTimeout)
			err := job.fn(octx, job.keys[:n])
			cancel()
			if err != nil {
				return err
			}
			p.o.Metrics.Published.WithLabelValues(job.op).Add(float64(n))
			job.keys = job.keys[n:]
		}
	}
	return nil
}

// deregister removes the record on the way out, on a fresh short context
// (the run's own has ended).
func (p *Publisher) deregister() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if err := p.o.Index.Deregister(ctx); err != nil {
		p.o.Log.Debug().Err(err).Msg("Cluster index: deregister failed (the record lapses after its TTL)")
	}
}
