// Package redisindex is the cluster index (internal/index) on Redis,
// Valkey or Redis Cluster, through go-redis's universal client: one URL
// is one server, a comma list a cluster.
//
// Key layout (docs/cluster.md, "Key layout"):
//
//	<prefix>n:<node>         string, JSON index.Node, EX ttl (membership)
//	<prefix>members          sorted set, node → record expiry (unix ms)
//	<prefix>b:<ns>/<hexhash> hash, node → incarnation that announced it,
//	                         with ";ssd" after it for a copy on the SSD tier only
//	<prefix>nb:<node>        set of the b: keys <node> announced (for Reset)
//
// Every key is addressed alone or in pipelines, never in one multi-key
// command, so on Redis Cluster each may live in any slot. It owns no state
// besides the client; the truth of what a node holds stays in its store.
package redisindex

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/pegaflow/pegad/internal/index"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/store"
)

// DefaultPrefix starts every key pegad writes.
const DefaultPrefix = "pegad:"

// Timeouts of one Redis round trip: a down Redis must fail a lookup fast,
// not hold a prefetch.
const (
	dialTimeout = time.Second
	ioTimeout   = 2 * time.Second
	// resetScan is how many members of a node's set one SSCAN returns.
	resetScan = 1000
)

// hdelIfScript deletes field ARGV[1] of hash KEYS[1] only while it still
// holds ARGV[2] (one key: any Redis Cluster slot).
const hdelIfScript = `if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0`

// ErrBadURL is returned for a --cluster-redis value that is not a list of
// redis:// or rediss:// URLs.
var ErrBadURL = errors.New("invalid cluster Redis URL")

// Options configure Open.
type Options struct {
	// URLs is --cluster-redis: one redis:// or rediss:// URL, or a comma
	// list of them (Redis Cluster seeds; credentials and TLS of the first).
	URLs string
	// NodeID and Incarnation name this node's entries.
	NodeID      string
	Incarnation string
	TTL         time.Duration
	// Prefix starts every key (DefaultPrefix when empty).
	Prefix  string
	Metrics *metrics.Cluster // required
}

// Index is a Redis-backed index.Index. Safe for concurrent use.
type Index struct {
	rdb    redis.UniversalClient // immutable
	o      Options               // immutable
	m      *metrics.Cluster      // immutable
	prefix string                // immutable
}

var _ index.Index = (*Index)(nil)

// ParseURLs turns --cluster-redis into go-redis universal options. It does
// not connect.
func ParseURLs(urls string) (*redis.UniversalOptions, error) {
	var uo redis.UniversalOptions
	for i, raw := range strings.Split(urls, ",") {
		raw = strings.TrimSpace(raw)
		if !strings.HasPrefix(raw, "redis://") && !strings.HasPrefix(raw, "rediss://") {
			return nil, fmt.Errorf("%w: %q: want redis://[user:password@]host:port[/db] or rediss://", ErrBadURL, raw)
		}
		o, err := redis.ParseURL(raw)
		if err != nil {
			return nil, fmt.Errorf("%w: %q: %v", ErrBadURL, raw, err)
		}
		uo.Addrs = append(uo.Addrs, o.Addr)
		if i == 0 {
			uo.Username, uo.Password, uo.DB, uo.TLSConfig = o.Username, o.Password, o.DB, o.TLSConfig
		}
	}
	if len(uo.Addrs) > 1 && uo.DB != 0 {
		return nil, fmt.Errorf("%w: Redis Cluster has no databases (drop /%d)", ErrBadURL, uo.DB)
	}
	uo.DialTimeout, uo.ReadTimeout, uo.WriteTimeout = dialTimeout, ioTimeout, ioTimeout
	uo.ContextTimeoutEnabled = true
	uo.MaxRetries = 1
	uo.DialerRetries = 1
	uo.ClientName = "pegad"
	return &uo, nil
}

// Open makes an index client. It does not wait for Redis: a node starts
// whether Redis is up or not, and the publisher registers when it is.
func Open(o Options) (*Index, error) {
	uo, err := ParseURLs(o.URLs)
	if err != nil {
		return nil, err
	}
	if o.NodeID == "" || o.Incarnation == "" || o.TTL <= 0 {
		return nil, errors.New("redisindex: node id, incarnation and TTL are required")
	}
	if o.Prefix == "" {
		o.Prefix = DefaultPrefix
	}
	if o.Metrics == nil {
		return nil, errors.New("redisindex: Metrics is required")
	}
	return &Index{rdb: redis.NewUniversalClient(uo), o: o, m: o.Metrics, prefix: o.Prefix}, nil
}

// Close closes the client's connections.
func (x *Index) Close() error { return x.rdb.Close() }

func (x *Index) nodeKey(id string) string       { return x.prefix + "n:" + id }
func (x *Index) membersKey() string             { return x.prefix + "members" }
func (x *Index) nodeBlocksKey(id string) string { return x.prefix + "nb:" + id }

// BlockKey is the Redis key of a block's holders.
func (x *Index) BlockKey(ns string, hash []byte) string {
	return x.prefix + "b:" + ns + "/" + hex.EncodeToString(hash)
}

func unavailable(op string, err error) error {
	return fmt.Errorf("%w: %s: %v", index.ErrUnavailable, op, err)
}

// Register writes the record with SET ... GET: the old value tells in the
// same round trip whether this incarnation was still registered.
func (x *Index) Register(ctx context.Context, self index.Node) (lost bool, err error) {
	self.ID, self.Incarnation = x.o.NodeID, x.o.Incarnation
	self.Expires = time.Time{}
	val, err := json.Marshal(self)
	if err != nil {
		return false, err
	}
	expiry := time.Now().Add(x.o.TTL)
	var old *redis.StatusCmd
	var live *redis.IntCmd
	now := time.Now()
	_, err = x.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		old = p.SetArgs(ctx, x.nodeKey(x.o.NodeID), val, redis.SetArgs{TTL: x.o.TTL, Get: true})
		p.ZAdd(ctx, x.membersKey(), redis.Z{Score: float64(expiry.UnixMilli()), Member: x.o.NodeID})
		// Members whose record lapsed long ago: keep the set small.
		p.ZRemRangeByScore(ctx, x.membersKey(), "-inf", strconv.FormatInt(now.Add(-10*x.o.TTL).UnixMilli(), 10))
		// Membership size for the metric, in the same round trip.
		live = p.ZCount(ctx, x.membersKey(), strconv.FormatInt(now.UnixMilli(), 10), "+inf")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return false, unavailable("register", err)
	}
	if n, err := live.Result(); err == nil {
		x.m.Nodes.Set(float64(n))
	}
	prev, err := old.Result()
	if errors.Is(err, redis.Nil) || (err == nil && prev == "") {
		return true, nil
	}
	if err != nil {
		return false, unavailable("register", err)
	}
	var n index.Node
	if json.Unmarshal([]byte(prev), &n) != nil || n.Incarnation != x.o.Incarnation {
		return true, nil
	}
	return false, nil
}

// Deregister deletes the record and the membership entry.
func (x *Index) Deregister(ctx context.Context) error {
	_, err := x.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, x.nodeKey(x.o.NodeID))
		p.ZRem(ctx, x.membersKey(), x.o.NodeID)
		return nil
	})
	if err != nil {
		return unavailable("deregister", err)
	}
	return nil
}

// Reset walks this node's set of announced keys and removes the node from
// each, then drops the set.
func (x *Index) Reset(ctx context.Context) error {
	set := x.nodeBlocksKey(x.o.NodeID)
	var cursor uint64
	for {
		keys, next, err := x.rdb.SScan(ctx, set, cursor, "", resetScan).Result()
		if err != nil {
			return unavailable("reset", err)
		}
		if len(keys) > 0 {
			_, err = x.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.HDel(ctx, k, x.o.NodeID)
				}
				return nil
			})
			if err != nil {
				return unavailable("reset", err)
			}
		}
		if cursor = next; cursor == 0 {
			break
		}
	}
	if err := x.rdb.Del(ctx, set).Err(); err != nil {
		return unavailable("reset", err)
	}
	return nil
}

// mediumSep separates the incarnation from the medium in a block entry.
const mediumSep = ";"

// entryValue is the value of this node's field in a block entry.
func (x *Index) entryValue(m index.Medium) string {
	if m == index.MediumSSD {
		return x.o.Incarnation + mediumSep + string(index.MediumSSD)
	}
	return x.o.Incarnation
}

// parseEntry splits an entry value into incarnation and medium.
func parseEntry(v string) (inc string, m index.Medium) {
	inc, med, ok := strings.Cut(v, mediumSep)
	if !ok || med == "" {
		return inc, index.MediumDRAM
	}
	return inc, index.Medium(med)
}

// Announce records this node (and incarnation) as a holder of keys on
// medium.
func (x *Index) Announce(ctx context.Context, medium index.Medium, keys []store.Key) error {
	v := x.entryValue(medium)
	return x.publish(ctx, "announce", keys, func(p redis.Pipeliner, bk string) {
		p.HSet(ctx, bk, x.o.NodeID, v)
	}, func(p redis.Pipeliner, set string, members []any) {
		p.SAdd(ctx, set, members...)
	})
}

// Withdraw removes this node as a holder of keys.
func (x *Index) Withdraw(ctx context.Context, keys []store.Key) error {
	return x.publish(ctx, "withdraw", keys, func(p redis.Pipeliner, bk string) {
		p.HDel(ctx, bk, x.o.NodeID)
	}, func(p redis.Pipeliner, set string, members []any) {
		p.SRem(ctx, set, members...)
	})
}

func (x *Index) publish(ctx context.Context, op string, keys []store.Key,
	perBlock func(redis.Pipeliner, string), perNode func(redis.Pipeliner, string, []any)) error {
	if len(keys) == 0 {
		return nil
	}
	members := make([]any, len(keys))
	_, err := x.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			bk := x.BlockKey(k.Namespace, []byte(k.Hash))
			members[i] = bk
			perBlock(p, bk)
		}
		perNode(p, x.nodeBlocksKey(x.o.NodeID), members)
		return nil
	})
	if err != nil {
		return unavailable(op, err)
	}
	return nil
}

// Nodes reads the live members' records.
func (x *Index) Nodes(ctx context.Context) ([]index.Node, error) {
	ids, err := x.rdb.ZRangeByScore(ctx, x.membersKey(), &redis.ZRangeBy{
		Min: strconv.FormatInt(time.Now().UnixMilli(), 10), Max: "+inf",
	}).Result()
	if err != nil {
		return nil, unavailable("nodes", err)
	}
	recs, err := x.records(ctx, ids)
	if err != nil {
		return nil, err
	}
	nodes := make([]index.Node, 0, len(recs))
	for _, id := range ids {
		if n, ok := recs[id]; ok {
			nodes = append(nodes, n)
		}
	}
	x.m.Nodes.Set(float64(len(nodes)))
	return nodes, nil
}

// records reads the membership records of ids; a lapsed one is absent.
func (x *Index) records(ctx context.Context, ids []string) (map[string]index.Node, error) {
	out, _, err := x.readRecords(ctx, ids, false)
	return out, err
}

// readRecords reads the membership records of ids (a lapsed one is
// absent) and, with dead, which of the absent ones lapsed more than two
// TTLs ago by the members set: gone for good, not merely re-registering
// after Redis restarted empty (which empties the members set too).
func (x *Index) readRecords(ctx context.Context, ids []string, dead bool) (map[string]index.Node, map[string]bool, error) {
	out := make(map[string]index.Node, len(ids))
	gone := make(map[string]bool)
	if len(ids) == 0 {
		return out, gone, nil
	}
	vals := make([]*redis.StringCmd, len(ids))
	ttls := make([]*redis.DurationCmd, len(ids))
	scores := make([]*redis.FloatCmd, len(ids))
	_, err := x.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			vals[i] = p.Get(ctx, x.nodeKey(id))
			ttls[i] = p.PTTL(ctx, x.nodeKey(id))
			if dead {
				scores[i] = p.ZScore(ctx, x.membersKey(), id)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, nil, unavailable("read node records", err)
	}
	now := time.Now()
	for i, id := range ids {
		v, err := vals[i].Result()
		if err != nil { // lapsed
			if dead {
				if sc, err := scores[i].Result(); err == nil && int64(sc) < now.Add(-2*x.o.TTL).UnixMilli() {
					gone[id] = true
				}
			}
			continue
		}
		var n index.Node
		if json.Unmarshal([]byte(v), &n) != nil || n.ID != id {
			continue // not ours to read: never trust a malformed record
		}
		if ttl, err := ttls[i].Result(); err == nil && ttl > 0 {
			n.Expires = now.Add(ttl)
		}
		out[id] = n
	}
	return out, gone, nil
}

// Locate reads each block's holders and keeps those whose record is live
// with the incarnation that announced the block. Entries of lapsed or
// restarted nodes are removed on the way (best effort): they can never
// count again, because a node that comes back clears and republishes.
func (x *Index) Locate(ctx context.Context, ns string, hashes [][]byte) (_ [][]index.Holder, err error) {
	defer func() {
		if err != nil {
			x.m.Lookups.WithLabelValues(metrics.LookupError).Inc()
		}
	}()
	cmds := make([]*redis.MapStringStringCmd, len(hashes))
	_, err = x.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, h := range hashes {
			cmds[i] = p.HGetAll(ctx, x.BlockKey(ns, h))
		}
		return nil
	})
	if err != nil {
		return nil, unavailable("locate", err)
	}
	entries := make([]map[string]string, len(hashes))
	var ids []string
	seen := make(map[string]bool)
	for i, c := range cmds {
		entries[i] = c.Val()
		for id := range entries[i] {
			if !seen[id] {
				seen[id] = true
				ids = append(ids, id)
			}
		}
	}
	recs, dead, err := x.readRecords(ctx, ids, true)
	if err != nil {
		return nil, err
	}
	out := make([][]index.Holder, len(hashes))
	type stale struct{ key, node, inc string }
	var gone []stale
	found := 0
	for i, e := range entries {
		for id, v := range e {
			inc, medium := parseEntry(v)
			n, ok := recs[id]
			if !ok || n.Incarnation != inc {
				if (ok && n.Incarnation != inc) || dead[id] {
					gone = append(gone, stale{x.BlockKey(ns, hashes[i]), id, v})
				}
				continue
			}
			out[i] = append(out[i], index.Holder{NodeID: id, Addr: n.Addr, Incarnation: inc, Medium: medium})
		}
		if len(out[i]) > 0 {
			found++
		}
	}
	if len(gone) > 0 {
		_, _ = x.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, g := range gone {
				// Only the stale incarnation's entry: never one the
				// restarted node wrote since we read it.
				p.Eval(ctx, hdelIfScript, []string{g.key}, g.node, g.inc)
			}
			return nil
		})
	}
	switch {
	case found == len(hashes):
		x.m.Lookups.WithLabelValues(metrics.LookupFound).Inc()
	case found > 0:
		x.m.Lookups.WithLabelValues(metrics.LookupPartial).Inc()
	default:
		x.m.Lookups.WithLabelValues(metrics.LookupNone).Inc()
	}
	return out, nil
}

// quiet drops go-redis's own log lines ("failed to dial"...): every
// failure reaches pegad as an error, which the publisher logs once per
// outage and the callers return.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quiet{}) }
