package store

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pegaflow/pegad/internal/evict"
)

// Namespace quotas (--namespace-quota, docs/tiering.md "Quotas"): a quota
// bounds the bytes of the indexed blocks whose namespace starts with its
// prefix (a full namespace is a prefix of itself); where prefixes
// overlap, a namespace belongs to the longest. Every namespace a quota
// covers shares it: the quota's used bytes are theirs together.
//
// A namespace at its quota makes room from its own blocks: an allocation
// that names its namespace (AllocExtentFor, Put) evicts the group's
// unpinned blocks in the policy's order until the new block fits the
// quota, and, when the pool is full too, until those evictions alone free
// a contiguous range. When the group's own blocks cannot do it (too few,
// pinned, or not contiguous), the allocation is refused with
// ErrQuotaExceeded (which is also ErrNoSpace: ResourceExhausted to
// clients) and nothing changes. A namespace under its quota allocates
// from the shared pool as before.
//
// Blocks inserted without such an allocation (a prefetch's staged copies,
// a reservation that becomes a block) are accounted at Insert: a group
// over its quota then evicts its own oldest (policy order) unpinned blocks
// down to it. Pinned blocks cannot go, so a group whose blocks are all
// pinned may stay above its quota until they are unpinned and the next
// allocation of the group trims it.
//
// Bookkeeping is O(1) per insert and removal (a group pointer on each
// block and a byte counter per group); an allocation that fits its quota
// takes the lock-free fast path as before; only eviction for a quota
// walks the policy's order, skipping other groups' blocks.

// ErrQuotaExceeded: the namespace is at its quota and its own blocks
// cannot make the room asked for. Errors carrying it carry ErrNoSpace too.
var ErrQuotaExceeded = errors.New("namespace quota exceeded")

// Quota bounds the bytes of indexed blocks of the namespaces starting
// with Prefix.
type Quota struct {
	Prefix string
	Bytes  uint64
}

// QuotaStats is one quota's state (admin stats).
type QuotaStats struct {
	Prefix              string
	Limit, Used         uint64
	Evictions, Refusals uint64
	Blocks              uint64
}

// quotaGroup is one configured quota. prefix and limit are immutable;
// the rest is guarded by Store.mu.
type quotaGroup struct {
	prefix string
	limit  uint64

	used, blocks        uint64
	evictions, refusals uint64
	// usedNow mirrors used (written with it, under mu) for the lock-free
	// check of AllocExtentFor's fast path.
	usedNow atomic.Uint64

	// The group's series; nil without metrics (quotaMetricsLocked).
	usedG           prometheus.Gauge
	evictC, refuseC prometheus.Counter
}

// quotaSet is the configured quotas, longest prefix first; immutable once
// published (Store.quotas).
type quotaSet struct{ groups []*quotaGroup }

// of is the group of namespace ns: the longest prefix that ns starts
// with, or nil.
func (q *quotaSet) of(ns string) *quotaGroup {
	if q == nil || ns == "" {
		return nil
	}
	for _, g := range q.groups {
		if strings.HasPrefix(ns, g.prefix) {
			return g
		}
	}
	return nil
}

// fitsNow reports, without the store lock, whether n more bytes look to
// fit g (nil: no quota). Two allocations may both pass it; Insert trims
// what they take beyond the quota (quotaAddLocked).
func (g *quotaGroup) fitsNow(n uint64) bool { return g == nil || g.usedNow.Load()+n <= g.limit }

// excess is how many bytes of g's blocks must go for n more to fit its
// quota (0: they fit, or g is nil).
func (g *quotaGroup) excess(n uint64) uint64 {
	if g == nil || g.used+n <= g.limit {
		return 0
	}
	return g.used + n - g.limit
}

// ValidateQuotas reports the first problem of qs: an empty prefix, a zero
// size, or a prefix given twice.
func ValidateQuotas(qs []Quota) error {
	seen := make(map[string]bool, len(qs))
	for _, q := range qs {
		if q.Prefix == "" {
			return fmt.Errorf("%w: namespace quota with an empty namespace", ErrInvalid)
		}
		if q.Bytes == 0 {
			return fmt.Errorf("%w: namespace quota %q of 0 bytes", ErrInvalid, q.Prefix)
		}
		if seen[q.Prefix] {
			return fmt.Errorf("%w: namespace quota %q given twice", ErrInvalid, q.Prefix)
		}
		seen[q.Prefix] = true
	}
	return nil
}

// SetQuotas replaces the quotas with qs (nil: none). Every indexed block
// is accounted to its new group, and a group over its new quota evicts
// its own unpinned blocks down to it at once. Invalid qs (ValidateQuotas)
// changes nothing. It walks every indexed block: for start-up and reloads.
func (s *Store) SetQuotas(qs []Quota) error {
	if err := ValidateQuotas(qs); err != nil {
		return err
	}
	set := &quotaSet{}
	for _, q := range qs {
		set.groups = append(set.groups, &quotaGroup{prefix: q.Prefix, limit: q.Bytes})
	}
	sort.SliceStable(set.groups, func(i, j int) bool { return len(set.groups[i].prefix) > len(set.groups[j].prefix) })

	s.mu.Lock()
	defer s.unlockNotify()
	old := s.quotas.Load()
	for _, b := range s.index.all() {
		b.quota = set.of(b.key.Namespace)
		if g := b.quota; g != nil {
			g.used += b.size
			g.blocks++
		}
	}
	for _, g := range set.groups {
		g.usedNow.Store(g.used)
	}
	s.quotaMetricsLocked(old, set)
	s.quotas.Store(set)
	for _, g := range set.groups {
		s.trimLocked(g, nil)
	}
	return nil
}

// quotaMetricsLocked moves the quota series from old to set: series of
// quotas carried over keep their counts.
func (s *Store) quotaMetricsLocked(old, set *quotaSet) {
	if s.m == nil || s.m.NamespaceQuota == nil {
		return
	}
	q := s.m.NamespaceQuota
	keep := make(map[string]bool, len(set.groups))
	for _, g := range set.groups {
		keep[g.prefix] = true
		q.Bytes.WithLabelValues(g.prefix).Set(float64(g.limit))
		g.usedG = q.Used.WithLabelValues(g.prefix)
		g.usedG.Set(float64(g.used))
		g.evictC = q.Evictions.WithLabelValues(g.prefix)
		g.refuseC = q.Refusals.WithLabelValues(g.prefix)
	}
	if old == nil {
		return
	}
	for _, g := range old.groups {
		if !keep[g.prefix] {
			q.Forget(g.prefix)
		}
	}
}

// Quotas is a snapshot of every quota, longest prefix first.
func (s *Store) Quotas() []QuotaStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	set := s.quotas.Load()
	if set == nil {
		return nil
	}
	out := make([]QuotaStats, len(set.groups))
	for i, g := range set.groups {
		out[i] = QuotaStats{Prefix: g.prefix, Limit: g.limit, Used: g.used, Evictions: g.evictions, Refusals: g.refusals, Blocks: g.blocks}
	}
	return out
}

// quotaAddLocked accounts b, just indexed, to its group; a group over its
// quota then evicts its own blocks (not b) down to it.
func (s *Store) quotaAddLocked(b *Block) {
	g := s.quotas.Load().of(b.key.Namespace)
	b.quota = g
	if g == nil {
		return
	}
	g.used += b.size
	g.blocks++
	g.usedNow.Store(g.used)
	if g.usedG != nil {
		g.usedG.Set(float64(g.used))
	}
	if g.used > g.limit {
		s.trimLocked(g, b)
	}
}

// quotaRemoveLocked takes b, leaving the index, off its group's books.
func (s *Store) quotaRemoveLocked(b *Block) {
	g := b.quota
	if g == nil {
		return
	}
	b.quota = nil
	g.used -= b.size
	g.blocks--
	g.usedNow.Store(g.used)
	if g.usedG != nil {
		g.usedG.Set(float64(g.used))
	}
}

// trimLocked evicts g's unpinned blocks other than keep, in the policy's
// order, until g is within its quota or none is left.
func (s *Store) trimLocked(g *quotaGroup, keep *Block) {
	over := g.excess(0)
	if over == 0 {
		return
	}
	var victims []*Block
	var freed uint64
	s.policy.Walk(func(n *evict.Node) bool {
		b := n.Value.(*Block)
		if b.quota != g || b.pins > 0 || b == keep {
			return true
		}
		victims = append(victims, b)
		freed += b.size
		return freed < over
	})
	s.evictLocked(victims, g)
}

// refuseLocked counts a refusal of g and returns its error.
func (s *Store) refuseLocked(g *quotaGroup, n uint64) error {
	g.refusals++
	if g.refuseC != nil {
		g.refuseC.Inc()
	}
	return fmt.Errorf("store: %d bytes for namespace quota %q (%d of %d bytes used) need other namespaces' blocks: %w: %w",
		n, g.prefix, g.used, g.limit, ErrQuotaExceeded, ErrNoSpace)
}
