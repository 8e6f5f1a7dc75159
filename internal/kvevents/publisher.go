// Package kvevents publishes the store's block changes as vLLM KV events
// (msgpack batches on a ZeroMQ PUB socket, with vLLM's replay socket), so
// a KV-aware router such as llm-d's kv-cache indexer learns which node
// holds which blocks in host memory.
//
// It owns the publisher goroutine, its bounded queue, the replay buffer
// and the subscribers' connections. It must never slow the store: the
// store hands changes to Enqueue under its lock, and Enqueue only appends
// to a bounded queue; when the queue or a subscriber's queue is full,
// changes are dropped and counted (pegaflow_kv_events_dropped_total),
// never waited for. It never reads the store either.
package kvevents

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// Defaults of Options left zero.
const (
	// DefaultQueue is how many store sections (one put, one eviction
	// round, one delete) wait for the publisher goroutine.
	DefaultQueue = 4096
	// DefaultSubscriberQueue is how many messages wait for one subscriber.
	DefaultSubscriberQueue = 1024
	// DefaultReplay is how many past messages the replay socket serves
	// (vLLM's buffer_steps is 10,000 too).
	DefaultReplay = 10000
	// batchDelay: once woken, Run lets changes gather this long before it
	// takes the queue, so a burst of puts wakes it once, not once per put
	// (a wake-up per put cost more than the put itself).
	batchDelay = time.Millisecond
)

// Options configure a Publisher.
type Options struct {
	// Endpoint is the PUB socket, bound: tcp://*:5557, tcp://host:port or
	// ipc:///path.
	Endpoint string
	// ReplayEndpoint is the ROUTER socket serving missed messages; "":
	// none.
	ReplayEndpoint string
	// Topic is the topic template (Topic's placeholders); "": DefaultTopic.
	Topic  string
	NodeID string
	// Queue, SubscriberQueue, Replay: 0 takes the defaults above.
	Queue, SubscriberQueue, Replay int
	Metrics                        *metrics.KVEvents // required
	Log                            zerolog.Logger

	sndBuf int // tests: SO_SNDBUF of accepted TCP connections (0: the kernel's)
}

// message is one published ZMQ message and the block changes it carries.
type message struct {
	seq     uint64
	topic   []byte
	payload []byte
	changes int
}

// Publisher turns store changes into KV-event messages. Enqueue is the
// store's OnEvents hook; Run (one goroutine, owned by the daemon) encodes,
// numbers and fans the messages out.
type Publisher struct {
	o      Options
	pub    *server // PUB subscribers
	replay *server // ROUTER replay clients; nil without ReplayEndpoint

	// mu guards queue. It is taken under the store's lock (Enqueue) and
	// nothing is called while it is held: a leaf lock.
	mu    sync.Mutex
	queue [][]store.Change
	wake  chan struct{} // cap 1: the queue is not empty

	// Owned by Run's goroutine.
	seq    uint64
	topics map[string][]byte // namespace → expanded topic
	// published: the Published counter of each kind, looked up once.
	published map[store.ChangeKind]prometheus.Counter

	// rmu guards ring and next: the last Replay messages, a circular
	// buffer whose oldest entry is ring[next] once full. Written by Run,
	// read by replay clients' goroutines.
	rmu  sync.Mutex
	ring []message
	next int
}

// New binds the endpoints (so a taken port fails start-up); nothing is
// published before Run.
func New(o Options) (*Publisher, error) {
	if o.Topic == "" {
		o.Topic = DefaultTopic
	}
	if o.Queue <= 0 {
		o.Queue = DefaultQueue
	}
	if o.SubscriberQueue <= 0 {
		o.SubscriberQueue = DefaultSubscriberQueue
	}
	if o.Replay <= 0 {
		o.Replay = DefaultReplay
	}
	if o.Metrics == nil {
		return nil, errors.New("kvevents: Metrics is required")
	}
	p := &Publisher{o: o, wake: make(chan struct{}, 1), topics: map[string][]byte{},
		published: map[store.ChangeKind]prometheus.Counter{}}
	for _, k := range []store.ChangeKind{store.Stored, store.Evicted, store.Deleted} {
		p.published[k] = o.Metrics.Published.WithLabelValues(k.String())
	}
	var err error
	if p.pub, err = listen(o.Endpoint, kindPub, p); err != nil {
		return nil, fmt.Errorf("kv-events-endpoint: %w", err)
	}
	if o.ReplayEndpoint != "" {
		if p.replay, err = listen(o.ReplayEndpoint, kindReplay, p); err != nil {
			p.pub.close()
			return nil, fmt.Errorf("kv-events-replay-endpoint: %w", err)
		}
	}
	return p, nil
}

// Addr is the PUB socket's bound address (host:port, or the ipc path).
func (p *Publisher) Addr() string { return p.pub.ln.Addr().String() }

// ReplayAddr is the replay socket's bound address; "" without one.
func (p *Publisher) ReplayAddr() string {
	if p.replay == nil {
		return ""
	}
	return p.replay.ln.Addr().String()
}

// Subscribers counts connected subscribers that have subscribed to
// something (a ZMQ SUB sends its subscriptions just after connecting).
func (p *Publisher) Subscribers() int { return p.pub.subscribed() }

// Enqueue is the store's OnEvents hook: it runs under the store's lock,
// so it only appends to the bounded queue, or drops and counts.
func (p *Publisher) Enqueue(changes []store.Change) {
	p.mu.Lock()
	full := len(p.queue) >= p.o.Queue
	if !full {
		p.queue = append(p.queue, changes)
	}
	p.mu.Unlock()
	if full {
		p.o.Metrics.Dropped.WithLabelValues(metrics.KVDropQueueFull).Add(float64(len(changes)))
		return
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Run publishes until ctx ends, then closes the sockets and waits for
// every connection's goroutines.
func (p *Publisher) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { p.pub.serve(ctx) })
	if p.replay != nil {
		wg.Go(func() { p.replay.serve(ctx) })
	}
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-p.wake:
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(batchDelay):
		}
		p.mu.Lock()
		q := p.queue
		p.queue = nil
		p.mu.Unlock()
		for _, changes := range q {
			p.publish(changes)
		}
	}
}

// publish sends one store section's changes: one message per run of the
// same namespace, in the store's order.
func (p *Publisher) publish(changes []store.Change) {
	now := time.Now()
	for len(changes) > 0 {
		ns := changes[0].Key.Namespace
		n := 1
		for n < len(changes) && changes[n].Key.Namespace == ns {
			n++
		}
		run := changes[:n]
		changes = changes[n:]
		topic, ok := p.topics[ns]
		if !ok {
			topic = []byte(Topic(p.o.Topic, p.o.NodeID, ns))
			p.topics[ns] = topic
		}
		m := message{
			seq:     p.seq,
			topic:   topic,
			payload: encodeBatch(now, run),
			changes: len(run),
		}
		p.seq++
		p.remember(m)
		p.pub.fanOut(m)
		for _, c := range run {
			if ctr := p.published[c.Kind]; ctr != nil {
				ctr.Inc()
			}
		}
	}
}

func (p *Publisher) remember(m message) {
	p.rmu.Lock()
	defer p.rmu.Unlock()
	if len(p.ring) < p.o.Replay {
		p.ring = append(p.ring, m)
		return
	}
	p.ring[p.next] = m
	p.next = (p.next + 1) % len(p.ring)
}

// since returns the remembered messages from seq on, oldest first.
func (p *Publisher) since(seq uint64) []message {
	p.rmu.Lock()
	ordered := append(append([]message(nil), p.ring[p.next:]...), p.ring[:p.next]...)
	p.rmu.Unlock()
	for i, m := range ordered {
		if m.seq >= seq {
			return ordered[i:]
		}
	}
	return nil
}

// Close closes the sockets of a publisher that Run never served (Run
// closes them itself when its context ends); safe to call again.
func (p *Publisher) Close() {
	p.pub.close()
	if p.replay != nil {
		p.replay.close()
	}
}
