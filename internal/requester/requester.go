// Package requester is pegad's prefetch engine: it fetches blocks from a
// named peer into this node's pool. One fetch: ensure connected, then a
// pipeline of lock windows, each fitting the holder's pin cap (window.go):
// lock a window on the holder (QueryBlocksForTransfer) → stage local
// memory → RDMA READ every segment → release the lock → index the blocks
// locally; the next window is locked while the current one is read.
//
// Every lock it takes is released exactly once on every exit of a fetch
// (success, error, panic, cancellation, shutdown) by a release guard
// (guard.go). A panic in the fetch path fails that fetch only: it is
// recovered at the Prefetch boundary and never crashes the daemon.
// Blocks read under a lock that lapsed are discarded, never indexed.
// Staging memory goes back to the pool only after the READs that target it
// have returned (the connection flushes its QPs before Read returns).
//
// It never frees holder-side state itself other than by the release RPC,
// and never tears down a connection for an error that is not the
// connection's (errors.go).
package requester

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/api/limits"
	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/conn"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// MaxChunk caps one staging extent (docs/lessons.md L5).
const MaxChunk = 256 << 20

// MaxHashes is the most hashes one Prefetch (one QueryBlocksForTransfer)
// may name.
const MaxHashes = limits.MaxBlocksPerRequest

// Defaults of timeouts the Options leave zero.
const (
	defaultTimeout        = 5 * time.Minute
	defaultReleaseTimeout = 5 * time.Second
	defaultLockRPCTimeout = 30 * time.Second
	defaultLockTimeout    = 120 * time.Second
)

// PeerDialer returns a peer-service client for a peer address.
type PeerDialer func(peer string) (pegadv1.PeerServiceClient, error)

// Options configure an Engine.
type Options struct {
	NodeID      string
	Incarnation string
	Store       *store.Store
	Conns       *conn.Dialer
	Peers       PeerDialer
	Metrics     *metrics.Metrics
	Log         zerolog.Logger
	// MaxChunk overrides MaxChunk (tests); 0 = MaxChunk.
	MaxChunk uint64
	// DefaultTimeout bounds a fetch when the caller gives none (0: 5m).
	DefaultTimeout time.Duration
	// ReleaseTimeout bounds the release RPC, retries included; the release
	// runs on a fresh context, never the fetch's (0: 5s).
	ReleaseTimeout time.Duration
}

// Status of one block in a fetch.
type Status int

const (
	StatusFetched Status = iota + 1
	StatusAlreadyLocal
	StatusMissingOnPeer
	StatusFailed
	StatusDiscarded
	// StatusNotFound: no live node has it (prefetch without a peer).
	StatusNotFound
	// StatusNotFetched: the pool had no room for it without evicting a
	// block this prefetch had already made local (ErrPoolTooSmall); nor
	// was any block after it fetched, so what was kept is a prefix.
	StatusNotFetched
)

func (s Status) String() string {
	switch s {
	case StatusFetched:
		return "fetched"
	case StatusAlreadyLocal:
		return "already_local"
	case StatusMissingOnPeer:
		return "missing_on_peer"
	case StatusFailed:
		return "failed"
	case StatusDiscarded:
		return "discarded"
	case StatusNotFound:
		return "not_found"
	case StatusNotFetched:
		return "not_fetched"
	}
	return fmt.Sprintf("status(%d)", int(s))
}

// BlockResult is the outcome for one requested hash.
type BlockResult struct {
	Hash   []byte
	Status Status
	Err    error
	// Node is the node that served (or failed) it; prefetch without a
	// peer only (cluster.go).
	Node string
}

// Result of a fetch.
type Result struct {
	Blocks    []BlockResult
	Bytes     uint64
	Duration  time.Duration
	SessionID string
	// ReqID names this fetch in logs (req_id) and in InFlight.
	ReqID string
}

// FetchInfo is an in-flight fetch, for `pegactl sessions list`.
type FetchInfo struct {
	ReqID     string
	Peer      string
	SessionID string
	Blocks    int
	Bytes     uint64
	BytesDone uint64 // read so far, counted as completions arrive
	Started   time.Time
	Phase     string
	// Handoff is the token of the peer's handoff the fetch pulls ("":
	// none).
	Handoff string
}

// Request is one prefetch (Engine.Fetch, Cluster.Fetch).
type Request struct {
	// Peer is the holder's address; "": the cluster index says
	// (Cluster.Fetch only).
	Peer      string
	Namespace string
	Hashes    [][]byte
	// Handoff is the token of the peer's handoff of these blocks ("":
	// none). Every lock query carries it, so the holder ends the
	// handoff's pin of each block once this fetch has read it.
	Handoff string
	// KnownPeerOnly: fetch only from a Peer that the cluster index lists
	// as live or that the peer port's mTLS checks against --peer-allow
	// (Cluster.Fetch checks; Engine.Fetch, which cannot, refuses).
	KnownPeerOnly bool
	// EndHandoff, with Handoff: this fetch is the consumer's whole pull;
	// once it is over the holder is told to end the handoff (endHandoff).
	EndHandoff bool
}

// Phases of a fetch, as InFlight reports them.
const (
	PhaseConnect = "connect"
	PhaseLock    = "lock"
	PhaseStage   = "stage"
	PhaseRead    = "read"
	PhaseRelease = "release"
	PhaseIndex   = "index"
	// PhaseWait: waiting for blocks another fetch is bringing in.
	PhaseWait = "wait"
)

// hooks let tests inject faults into the fetch path.
type hooks struct {
	// phase runs as the fetch enters each phase (it may panic).
	phase func(ctx context.Context, reqID, phase string)
}

// Engine is safe for concurrent use.
type Engine struct {
	opts           Options
	log            zerolog.Logger
	m              *metrics.Metrics
	store          blockStore
	conns          connector
	peers          PeerDialer
	hooks          hooks
	maxChunk       uint64
	defaultTimeout time.Duration
	releaseTimeout time.Duration
	lockRPCTimeout time.Duration
	// reconnectWait: see connect (tests shorten it).
	reconnectWait time.Duration

	// ctx is canceled (cause errClosed) by Close; every fetch watches it.
	ctx    context.Context
	cancel context.CancelCauseFunc
	// wg counts running Prefetch calls; Close waits for it.
	wg sync.WaitGroup

	mu sync.Mutex // guards closed, running
	// closed is set by Close; no Prefetch starts afterwards (wg.Add happens
	// under mu only while !closed, so Close's Wait cannot race an Add).
	closed bool
	// flights: each block being fetched and its one in-flight fetch.
	flights flightTable
	// running is every Prefetch in progress, by req_id.
	running map[string]*fetchState
}

// fetchState is the live view of one Prefetch, for InFlight and logs.
type fetchState struct {
	reqID   string
	peer    string
	ns      string
	handoff string // Request.Handoff
	started time.Time
	// keep holds what this prefetch made local until it returns.
	keep *keepSet

	mu      sync.Mutex // guards phase, session, blocks, bytes
	phase   string
	session string
	blocks  int
	bytes   uint64
	// done counts bytes read so far, as READ completions arrive.
	done atomic.Uint64
}

func (s *fetchState) setPhase(p string) {
	s.mu.Lock()
	s.phase = p
	s.mu.Unlock()
}

func (s *fetchState) getPhase() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.phase
}

// addWindow records a lock window about to be read: its session, and its
// blocks and bytes added to the fetch's (a fetch's total grows as its
// windows are locked; done counts across them).
func (s *fetchState) addWindow(sid string, blocks int, bytes uint64) {
	s.mu.Lock()
	s.session = sid
	s.blocks += blocks
	s.bytes += bytes
	s.mu.Unlock()
}

func New(opts Options) (*Engine, error) {
	if opts.Store == nil || opts.Conns == nil || opts.Peers == nil {
		return nil, errors.New("requester: Store, Conns and Peers are required")
	}
	return newEngine(opts, storeAdapter{opts.Store}, dialerConns{opts.Conns}, hooks{})
}

// newEngine builds an engine over any store and connector (tests use fakes).
func newEngine(opts Options, st blockStore, cs connector, h hooks) (*Engine, error) {
	if opts.Peers == nil {
		return nil, errors.New("requester: Peers is required")
	}
	if opts.Metrics == nil {
		return nil, errors.New("requester: Metrics is required")
	}
	e := &Engine{
		opts:           opts,
		log:            opts.Log,
		m:              opts.Metrics,
		store:          st,
		conns:          cs,
		peers:          opts.Peers,
		hooks:          h,
		maxChunk:       opts.MaxChunk,
		defaultTimeout: opts.DefaultTimeout,
		releaseTimeout: opts.ReleaseTimeout,
		lockRPCTimeout: defaultLockRPCTimeout,
		reconnectWait:  defaultReconnectWait,
		flights:        flightTable{m: make(map[store.Key]*flight)},
		running:        make(map[string]*fetchState),
	}
	if e.maxChunk == 0 {
		e.maxChunk = MaxChunk
	}
	if e.defaultTimeout <= 0 {
		e.defaultTimeout = defaultTimeout
	}
	if e.releaseTimeout <= 0 {
		e.releaseTimeout = defaultReleaseTimeout
	}
	e.ctx, e.cancel = context.WithCancelCause(context.Background())
	return e, nil
}

func (e *Engine) requester() *pegadv1.Requester {
	return &pegadv1.Requester{NodeId: e.opts.NodeID, Incarnation: e.opts.Incarnation}
}

// PhaseHook runs as a fetch enters each phase (PhaseConnect, PhaseLock,
// PhaseStage, PhaseRead, PhaseRelease, PhaseIndex) with the fetch's
// context and req_id. It exists for fault-injection tests: it may panic
// (the engine recovers at the Prefetch boundary and the release guard
// frees any lock taken), block, or cancel what ctx derives from.
type PhaseHook func(ctx context.Context, reqID, phase string)

// SetFaultHook installs f as the engine's PhaseHook. Tests only (the
// daemon's WithRequesterFaults); call it before the first Prefetch: the
// hook is read without a lock. Production engines never have one.
func (e *Engine) SetFaultHook(f PhaseHook) { e.hooks.phase = f }

func (e *Engine) hook(ctx context.Context, st *fetchState, phase string) {
	st.setPhase(phase)
	if e.hooks.phase != nil {
		e.hooks.phase(ctx, st.reqID, phase)
	}
}

func newReqID() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func validate(peer, ns string, hashes [][]byte) error {
	switch {
	case peer == "":
		return errors.New("empty peer address")
	case len(hashes) == 0:
		return errors.New("no hashes")
	case len(hashes) > MaxHashes:
		return fmt.Errorf("%d hashes (max %d per prefetch)", len(hashes), MaxHashes)
	}
	return limits.ValidChain(ns, hashes)
}

// Prefetch fetches hashes of namespace from peer. The error is non-nil when
// the fetch as a whole failed; per-block outcomes are in Result. Blocks
// already local are not fetched again; a block another Prefetch is already
// fetching is waited for, not fetched twice.
func (e *Engine) Prefetch(ctx context.Context, peer, namespace string, hashes [][]byte) (*Result, error) {
	return e.Fetch(ctx, Request{Peer: peer, Namespace: namespace, Hashes: hashes})
}

// Fetch is Prefetch of r, with r's handoff token. r.KnownPeerOnly is
// refused (ErrUnknownPeer): the engine has nothing to check a peer
// against; Cluster.Fetch does.
func (e *Engine) Fetch(ctx context.Context, r Request) (*Result, error) {
	peer, namespace, hashes := r.Peer, r.Namespace, r.Hashes
	if r.KnownPeerOnly {
		return nil, &FetchError{Peer: peer, Phase: "validate", Class: ErrUnknownPeer,
			Err: fmt.Errorf("peer %q: %s", peer, noPeerCheck)}
	}
	start := time.Now()
	if err := validate(peer, namespace, hashes); err != nil {
		e.m.FetchErrors.WithLabelValues(classInvalid).Inc()
		e.m.FetchTotal.WithLabelValues(metrics.FetchError).Inc()
		return nil, &FetchError{Peer: peer, Phase: "validate", Class: ErrInvalidInput, Err: err}
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil, errClosed
	}
	e.wg.Add(1)
	e.mu.Unlock()
	defer e.wg.Done()
	e.m.FetchesInFlight.Inc()
	defer e.m.FetchesInFlight.Dec()

	// The fetch ends when the caller cancels, its deadline passes, or the
	// engine closes (cause errClosed).
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(e.ctx, func() { cancel(errClosed) })
	defer stop()
	if _, ok := ctx.Deadline(); !ok {
		var c context.CancelFunc
		ctx, c = context.WithTimeout(ctx, e.defaultTimeout)
		defer c()
	}

	// What this prefetch makes local stays until it returns (or until the
	// Cluster prefetch that shares the set does), so its own staging never
	// evicts it.
	keep := keepOf(ctx)
	if keep == nil {
		keep = newKeepSet(e.store)
		defer keep.release()
	}
	st := &fetchState{reqID: newReqID(), peer: peer, ns: namespace, handoff: r.Handoff, started: start, keep: keep}
	res := &Result{Blocks: make([]BlockResult, len(hashes)), ReqID: st.reqID}
	for i, h := range hashes {
		res.Blocks[i] = BlockResult{Hash: h, Status: StatusFailed}
	}

	e.mu.Lock()
	e.running[st.reqID] = st
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.running, st.reqID)
		e.mu.Unlock()
	}()

	run := &prefetchRun{e: e, st: st, res: res, outcome: make(map[string]BlockResult, len(hashes))}
	var pending [][]byte
	for _, h := range hashes {
		if _, dup := run.outcome[string(h)]; !dup {
			run.outcome[string(h)] = BlockResult{Status: StatusFailed}
			pending = append(pending, h)
		}
	}
	for len(pending) > 0 {
		pending = run.round(ctx, pending)
	}
	outcome := run.outcome
	for i, h := range hashes {
		r := outcome[string(h)]
		res.Blocks[i].Status, res.Blocks[i].Err = r.Status, r.Err
	}
	err := run.ferr
	if err == nil {
		err = run.joinErr
	}
	res.Duration = time.Since(start)
	e.account(res, err, run.fetched)
	if r.EndHandoff && r.Handoff != "" {
		e.endHandoff(st)
	}
	return res, err
}

// account updates the per-Prefetch metrics.
func (e *Engine) account(res *Result, err error, fetched bool) {
	e.m.FetchDuration.Observe(res.Duration.Seconds())
	status := metrics.FetchOK
	var fe *FetchError
	switch {
	case err == nil:
		missing := fetched
		for _, b := range res.Blocks {
			if b.Status != StatusMissingOnPeer {
				missing = false
			}
		}
		if missing {
			status = metrics.FetchMissing
		}
	case errors.Is(err, ErrPanic):
		status = metrics.FetchPanic
	case errors.Is(err, ErrDiscarded):
		status = metrics.FetchDiscarded
	case errors.As(err, &fe) && fe.Class == nil:
		status = metrics.FetchCanceled
	default:
		status = metrics.FetchError
	}
	if fe != nil || errors.As(err, &fe) {
		if l := classLabel(fe.Class); l != "" {
			e.m.FetchErrors.WithLabelValues(l).Inc()
		}
	}
	e.m.FetchTotal.WithLabelValues(status).Inc()
}

// InFlight lists the fetches running now, oldest first.
func (e *Engine) InFlight() []FetchInfo {
	e.mu.Lock()
	states := make([]*fetchState, 0, len(e.running))
	for _, s := range e.running {
		states = append(states, s)
	}
	e.mu.Unlock()
	infos := make([]FetchInfo, 0, len(states))
	for _, s := range states {
		s.mu.Lock()
		infos = append(infos, FetchInfo{
			ReqID: s.reqID, Peer: s.peer, SessionID: s.session, Blocks: s.blocks,
			Bytes: s.bytes, BytesDone: s.done.Load(), Started: s.started, Phase: s.phase, Handoff: s.handoff,
		})
		s.mu.Unlock()
	}
	sort.Slice(infos, func(i, j int) bool { return infos[i].Started.Before(infos[j].Started) })
	return infos
}

// Close cancels in-flight fetches (their guards release the locks) and
// waits for them. Call it before closing the peer clients and the
// connection manager the fetches use. Idempotent.
func (e *Engine) Close() error {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.cancel(errClosed)
	e.wg.Wait()
	return nil
}
