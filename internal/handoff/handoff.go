// Package handoff owns prefill/decode handoffs: pins that a producer (a
// prefill engine) takes on its own node's blocks for a consumer (a decode
// engine) on another node, so that the producer can free its GPU memory at
// once and the consumer still finds every byte here.
//
// A handoff is a set of store pins under an unguessable token, with its own
// ttl, ordered by deadline in a lease.Queue (the daemon's one
// implementation of deadline order and expiry; the lease sweeper drives
// ExpireBefore). It ends exactly once, each block's pin given back exactly
// once:
//
//   - Pulled: a consumer's transfer session that named the token was
//     released after reading its blocks (the holder calls it); the
//     handoff's pin of those blocks ends, and the handoff completes when
//     none is left;
//   - Done: its consumer is done with it (its pull is over, complete or
//     not: it had some blocks already, or stopped early); the pins of
//     the blocks it did not pull end now, not at the ttl;
//   - Release: the producer ends it early;
//   - ExpireBefore: its ttl passed (the sweeper);
//   - Close: the daemon shuts down.
//
// It owns only this bookkeeping and the store pins it took: it never
// touches the network or decides who may pull (the holder's peer port
// and its mTLS do).
package handoff

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/pegaflow/pegad/api/limits"
	"github.com/pegaflow/pegad/internal/lease"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// Bounds of a handoff.
const (
	DefaultTTL = 30 * time.Second
	MaxTTL     = 300 * time.Second
	// DefaultMaxPending bounds the handoffs pending at once (Options).
	DefaultMaxPending = 1 << 16
)

// Token layout: hex of an 8-byte id and a 16-byte secret. The id names the
// handoff in listings and logs; only the whole token ends or pulls it.
const (
	idLen     = 8
	secretLen = 16
	// TokenLen is a token's length in characters.
	TokenLen = 2 * (idLen + secretLen)
	// IDLen is the length of a handoff's id (the token's prefix).
	IDLen = 2 * idLen
)

// Errors of Open and Release; callers branch on them (errors.Is).
var (
	// ErrMissing: some blocks of an Open are not stored here; nothing
	// was pinned.
	ErrMissing = errors.New("handoff: blocks not stored here")
	// ErrInvalid: a malformed request (ttl, token, keys); nothing changed.
	ErrInvalid = errors.New("handoff: invalid request")
	// ErrLimit: the node holds its maximum of pending handoffs.
	ErrLimit = errors.New("handoff: too many pending handoffs")
	// ErrDraining: the table is shut down (the daemon is draining); named
	// for what callers map it to, so that only conn and ibv export an ErrClosed.
	ErrDraining = errors.New("handoff: shutting down")
)

// Pinner is the part of *store.Store a handoff uses.
type Pinner interface {
	Pin(keys []store.Key) (pinned []*store.Block, missing []int)
	Unpin(blocks []*store.Block)
}

// Options configure New.
type Options struct {
	Store   Pinner
	Metrics *metrics.PD // required
	Log     zerolog.Logger
	// MaxPending bounds the pending handoffs (0: DefaultMaxPending).
	MaxPending int
	Now        func() time.Time // nil: time.Now
}

// entry is one pending handoff. id, secret, ns, total, bytes, created and
// ttl are immutable; blocks and the lease are guarded by Table.mu.
type entry struct {
	lease   lease.Item
	id      [idLen]byte
	secret  [secretLen]byte
	ns      string
	blocks  map[string]*store.Block // by hash: the pins not yet pulled
	total   int
	bytes   uint64
	created time.Time
	ttl     time.Duration
}

// LeaseItem is the handoff's lease (lease.Leased).
func (e *entry) LeaseItem() *lease.Item { return &e.lease }

// Table is safe for concurrent use.
type Table struct {
	o     Options
	clock lease.Clock
	// mu guards byID, expiry, closed and every entry's blocks. Store
	// calls (Pin, Unpin) are made outside it.
	mu     sync.Mutex
	byID   map[[idLen]byte]*entry
	expiry lease.Queue[*entry]
	closed bool
}

// New makes an empty table.
func New(o Options) (*Table, error) {
	if o.Store == nil {
		return nil, errors.New("handoff: Store is required")
	}
	if o.Metrics == nil {
		return nil, errors.New("handoff: Metrics is required")
	}
	if o.MaxPending <= 0 {
		o.MaxPending = DefaultMaxPending
	}
	return &Table{o: o, clock: lease.NewClock(o.Now), byID: make(map[[idLen]byte]*entry)}, nil
}

// Handoff is what Open granted.
type Handoff struct {
	Token   string
	Blocks  int
	Bytes   uint64
	TTL     time.Duration
	Expires time.Time
}

// Open pins every block of hashes in namespace under a new token for ttl
// (0: DefaultTTL). A hash repeated is pinned once. ErrMissing when any
// block is not stored here (the message says how many): nothing is
// pinned then.
func (t *Table) Open(namespace string, hashes [][]byte, ttl time.Duration) (Handoff, error) {
	switch {
	case ttl < 0 || ttl > MaxTTL:
		return Handoff{}, fmt.Errorf("%w: ttl %s: want 0 (default %s) up to %s", ErrInvalid, ttl, DefaultTTL, MaxTTL)
	case ttl == 0:
		ttl = DefaultTTL
	}
	if err := limits.ValidChain(namespace, hashes); err != nil {
		return Handoff{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(hashes) == 0 {
		return Handoff{}, fmt.Errorf("%w: no hashes", ErrInvalid)
	}
	keys := make([]store.Key, 0, len(hashes))
	seen := make(map[string]bool, len(hashes))
	for _, h := range hashes {
		if !seen[string(h)] {
			seen[string(h)] = true
			keys = append(keys, store.Key{Namespace: namespace, Hash: string(h)})
		}
	}
	pinned, missing := t.o.Store.Pin(keys)
	if len(missing) > 0 {
		t.o.Store.Unpin(pinned)
		return Handoff{}, fmt.Errorf("%w: %d of %d blocks of namespace %q (the first missing is %x): nothing pinned",
			ErrMissing, len(missing), len(keys), namespace, keys[missing[0]].Hash)
	}
	e := &entry{ns: namespace, blocks: make(map[string]*store.Block, len(pinned)), total: len(pinned), ttl: ttl}
	for _, b := range pinned {
		e.blocks[b.Key().Hash] = b
		e.bytes += b.Size()
	}
	if _, err := rand.Read(e.secret[:]); err != nil {
		t.o.Store.Unpin(pinned)
		return Handoff{}, fmt.Errorf("handoff: crypto/rand: %w", err)
	}
	if err := t.add(e); err != nil {
		t.o.Store.Unpin(pinned)
		return Handoff{}, err
	}
	t.o.Metrics.Pending.Inc()
	t.o.Log.Debug().Str("handoff", hex.EncodeToString(e.id[:])).Str("namespace", namespace).
		Int("blocks", e.total).Uint64("bytes", e.bytes).Stringer("ttl", ttl).Msg("Handoff pinned")
	return Handoff{Token: e.token(), Blocks: e.total, Bytes: e.bytes, TTL: ttl, Expires: e.created.Add(ttl)}, nil
}

// add gives e a fresh id and queues it.
func (t *Table) add(e *entry) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case t.closed:
		return ErrDraining
	case len(t.byID) >= t.o.MaxPending:
		return fmt.Errorf("%w: %d pending", ErrLimit, len(t.byID))
	}
	for {
		if _, err := rand.Read(e.id[:]); err != nil {
			return fmt.Errorf("handoff: crypto/rand: %w", err)
		}
		if _, dup := t.byID[e.id]; !dup {
			break
		}
	}
	now := t.clock.Now()
	e.created = now
	t.byID[e.id] = e
	t.expiry.Add(e, t.clock.Stamp(now)+lease.Stamp(e.ttl))
	return nil
}

func (e *entry) token() string {
	return hex.EncodeToString(e.id[:]) + hex.EncodeToString(e.secret[:])
}

// ParseToken splits a token into its id and secret; ErrInvalid when it is
// not one.
func ParseToken(tok string) (id [idLen]byte, secret [secretLen]byte, err error) {
	if len(tok) != TokenLen {
		return id, secret, fmt.Errorf("%w: token of %d characters, want %d", ErrInvalid, len(tok), TokenLen)
	}
	raw, derr := hex.DecodeString(tok)
	if derr != nil {
		return id, secret, fmt.Errorf("%w: token is not hex", ErrInvalid)
	}
	copy(id[:], raw[:idLen])
	copy(secret[:], raw[idLen:])
	return id, secret, nil
}

// ID is the id part of a well-formed token, for listings ("" otherwise).
func ID(tok string) string {
	if _, _, err := ParseToken(tok); err != nil {
		return ""
	}
	return tok[:IDLen]
}

// liveLocked is the handoff tok names, if its lease still runs at now;
// nil otherwise (a lapsed one is left to the sweeper). t.mu held.
func (t *Table) liveLocked(tok string, now time.Time) *entry {
	id, secret, err := ParseToken(tok)
	if err != nil {
		return nil
	}
	e := t.byID[id]
	if e == nil || subtle.ConstantTimeCompare(e.secret[:], secret[:]) != 1 || e.lease.Lapsed(t.clock.Stamp(now)) {
		return nil
	}
	return e
}

// removeLocked takes e out of the table; t.mu held. The caller unpins
// what it took from e.blocks.
func (t *Table) removeLocked(e *entry) []*store.Block {
	delete(t.byID, e.id)
	t.expiry.Remove(e)
	rest := make([]*store.Block, 0, len(e.blocks))
	for _, b := range e.blocks {
		rest = append(rest, b)
	}
	clear(e.blocks)
	return rest
}

// Release ends the handoff tok names and unpins the blocks not pulled
// yet; released false when tok names no live handoff (unknown, pulled,
// expired or released already). ErrInvalid for a malformed token.
func (t *Table) Release(tok string) (released bool, blocks int, err error) {
	e, rest, _, err := t.end(tok)
	if e == nil {
		return false, 0, err
	}
	t.ended(e, metrics.HandoffReleased)
	t.o.Log.Debug().Str("handoff", hex.EncodeToString(e.id[:])).Int("unpinned", len(rest)).Msg("Handoff released")
	return true, len(rest), nil
}

// end removes the live handoff tok names and unpins its blocks not pulled
// yet (returned, for the count); e nil when tok names none, with
// ErrInvalid for a malformed token. now is when it looked.
func (t *Table) end(tok string) (e *entry, rest []*store.Block, now time.Time, err error) {
	if _, _, err := ParseToken(tok); err != nil {
		return nil, nil, now, err
	}
	now = t.clock.Now()
	t.mu.Lock()
	if e = t.liveLocked(tok, now); e != nil {
		rest = t.removeLocked(e)
	}
	t.mu.Unlock()
	if e != nil {
		t.o.Store.Unpin(rest)
	}
	return e, rest, now, nil
}

// Pulled ends the handoff's pin of the blocks of namespace that a
// consumer has read (keys of a transfer session released live after a
// complete read that named tok). The handoff completes when no block is
// left. A token naming no live handoff, or keys of another namespace or
// not in it, change nothing. It returns how many pins it ended.
func (t *Table) Pulled(tok string, keys []store.Key) int {
	now := t.clock.Now()
	var done []*store.Block
	t.mu.Lock()
	e := t.liveLocked(tok, now)
	if e == nil {
		t.mu.Unlock()
		return 0
	}
	for _, k := range keys {
		if k.Namespace != e.ns {
			continue
		}
		if b, ok := e.blocks[k.Hash]; ok {
			delete(e.blocks, k.Hash)
			done = append(done, b)
		}
	}
	complete := len(e.blocks) == 0
	if complete {
		t.removeLocked(e)
	}
	t.mu.Unlock()
	t.o.Store.Unpin(done)
	if complete {
		age := now.Sub(e.created)
		t.o.Metrics.HandoffAge.Observe(age.Seconds())
		t.ended(e, metrics.HandoffCompleted)
		t.o.Log.Debug().Str("handoff", hex.EncodeToString(e.id[:])).Int("blocks", e.total).Dur("age", age).
			Msg("Handoff completed: the consumer pulled every block")
	}
	return len(done)
}

// Done ends the handoff tok names because its consumer is done with it
// (the holder's EndHandoff, sent once the consumer's pull is over): the
// pins of blocks not pulled end now, and it counts as completed. It is
// Release with the consumer's result: ended false when tok names no live
// handoff (a wrong secret names none), ErrInvalid for a malformed token.
func (t *Table) Done(tok string) (ended bool, blocks int, err error) {
	e, rest, now, err := t.end(tok)
	if e == nil {
		return false, 0, err
	}
	age := now.Sub(e.created)
	t.o.Metrics.HandoffAge.Observe(age.Seconds())
	t.ended(e, metrics.HandoffCompleted)
	t.o.Log.Debug().Str("handoff", hex.EncodeToString(e.id[:])).Int("blocks", e.total).Int("unpulled", len(rest)).
		Dur("age", age).Msg("Handoff completed: its consumer is done with it")
	return true, len(rest), nil
}

func (t *Table) ended(e *entry, result string) {
	t.o.Metrics.Pending.Dec()
	t.o.Metrics.Handoffs.WithLabelValues(result).Inc()
}

// ExpireBefore ends every handoff whose ttl passed by now and returns how
// many (lease.Expirer: the daemon's sweeper runs it).
func (t *Table) ExpireBefore(now time.Time) int {
	type gone struct {
		e    *entry
		rest []*store.Block
	}
	var expired []gone
	nowS := t.clock.Stamp(now)
	t.mu.Lock()
	for e, ok := t.expiry.PopLapsed(nowS); ok; e, ok = t.expiry.PopLapsed(nowS) {
		expired = append(expired, gone{e, t.removeLocked(e)})
	}
	t.mu.Unlock()
	for _, g := range expired {
		t.o.Store.Unpin(g.rest)
		t.ended(g.e, metrics.HandoffExpired)
		t.o.Log.Info().Str("handoff", hex.EncodeToString(g.e.id[:])).Str("namespace", g.e.ns).
			Int("blocks", g.e.total).Int("unpulled", len(g.rest)).Stringer("ttl", g.e.ttl).
			Msg("Handoff expired before its consumer pulled it")
	}
	return len(expired)
}

// Close ends every pending handoff (counted as released) and refuses
// later Opens; it returns how many ended. Idempotent.
func (t *Table) Close() int {
	t.mu.Lock()
	t.closed = true
	all := make([]*entry, 0, len(t.byID))
	for _, e := range t.byID {
		all = append(all, e)
	}
	var rest []*store.Block
	for _, e := range all {
		rest = append(rest, t.removeLocked(e)...)
	}
	t.mu.Unlock()
	t.o.Store.Unpin(rest)
	for _, e := range all {
		t.ended(e, metrics.HandoffReleased)
	}
	return len(all)
}

// Info is one pending handoff, for `pegactl sessions list`.
type Info struct {
	ID        string // the token's prefix
	Namespace string
	Blocks    int // still pinned
	Total     int
	Bytes     uint64
	Age       time.Duration
	TTLLeft   time.Duration
}

// List returns up to limit pending handoffs, oldest first, and whether
// there were more.
func (t *Table) List(limit int) ([]Info, bool) {
	now := t.clock.Now()
	nowS := t.clock.Stamp(now)
	t.mu.Lock()
	out := make([]Info, 0, len(t.byID))
	for _, e := range t.byID {
		if e.lease.Lapsed(nowS) {
			continue
		}
		out = append(out, Info{
			ID: hex.EncodeToString(e.id[:]), Namespace: e.ns, Blocks: len(e.blocks), Total: e.total,
			Bytes: e.bytes, Age: now.Sub(e.created), TTLLeft: time.Duration(e.lease.Deadline() - nowS),
		})
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Age > out[j].Age })
	if len(out) > limit {
		return out[:limit], true
	}
	return out, false
}

// Len is the number of pending handoffs.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.byID)
}
