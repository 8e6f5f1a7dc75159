package ctl

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
)

// NewStatsCommand shows the daemon's counters: pool, store, locks, fetches.
func NewStatsCommand(g *globalFlags) *cobra.Command {
	var watch time.Duration
	cmd := &cobra.Command{
		Use:   "stats",
		Short: "Show pool usage, blocks, sessions, locks, connections and fetch counters",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return g.repeat(cmd, watch, func(ctx context.Context, c *pegaclient.Client) (result, error) {
				res, err := c.Admin().Stats(ctx, &pegadv1.StatsRequest{})
				if err != nil {
					return nil, err
				}
				return statsOf(res), nil
			})
		},
	}
	addWatchFlag(cmd, &watch)
	return cmd
}

type statsResult struct {
	NodeID         string  `json:"node_id"`
	Incarnation    string  `json:"incarnation"`
	Transport      string  `json:"transport"`
	UptimeSeconds  float64 `json:"uptime_seconds"`
	PoolSize       uint64  `json:"pool_size"`
	PoolUsed       uint64  `json:"pool_used"`
	PoolFree       uint64  `json:"pool_free"`
	PoolLocked     bool    `json:"pool_locked"`
	Blocks         uint64  `json:"blocks"`
	PinnedBlocks   uint64  `json:"pinned_blocks"`
	Evictions      uint64  `json:"evictions"`
	Eviction       string  `json:"eviction_policy"`
	EvictionWeight float64 `json:"eviction_weight"`
	EvictionSample uint64  `json:"eviction_samples"`
	SessionsActive uint64  `json:"sessions_active"`
	LockedBlocks   uint64  `json:"locked_blocks"`
	LockTimeouts   uint64  `json:"lock_timeouts"`
	Conns          uint32  `json:"conns"`
	QPs            uint32  `json:"qps"`
	FetchesOK      uint64  `json:"fetches_ok"`
	FetchesFailed  uint64  `json:"fetches_failed"`
	FetchBytes     uint64  `json:"fetch_bytes"`
	Lookups        uint64  `json:"lookups"`
	LookupHits     uint64  `json:"lookup_hit_blocks"`
	LookupMisses   uint64  `json:"lookup_miss_blocks"`
	// Recomputed: puts of blocks evicted before; Ceiling: (hits +
	// Recomputed) / (hits + misses), 0 before the first lookup.
	Recomputed uint64  `json:"recomputed_blocks"`
	Ceiling    float64 `json:"hit_ratio_ceiling"`
	// Quotas: --namespace-quota's groups, longest prefix first ([] without).
	Quotas []quotaRow `json:"quotas"`
}

// quotaRow is one namespace quota's state.
type quotaRow struct {
	Prefix    string `json:"prefix"`
	Limit     uint64 `json:"limit_bytes"`
	Used      uint64 `json:"used_bytes"`
	Blocks    uint64 `json:"blocks"`
	Evictions uint64 `json:"evictions"`
	Refusals  uint64 `json:"refusals"`
}

// quotasOf converts the response's quotas.
func quotasOf(qs []*pegadv1.NamespaceQuota) []quotaRow {
	out := make([]quotaRow, 0, len(qs))
	for _, q := range qs {
		out = append(out, quotaRow{Prefix: q.GetPrefix(), Limit: q.GetLimitBytes(), Used: q.GetUsedBytes(),
			Blocks: q.GetBlocks(), Evictions: q.GetEvictions(), Refusals: q.GetRefusals()})
	}
	return out
}

// quota is one QUOTA row's value: used of limit, blocks, and what keeping
// to it cost.
func (q quotaRow) String() string {
	pct := 0.0
	if q.Limit > 0 {
		pct = 100 * float64(q.Used) / float64(q.Limit)
	}
	return fmt.Sprintf("%s of %s (%.1f%%), %d blocks, %d evicted for it, %d refused",
		humanBytes(q.Used), humanBytes(q.Limit), pct, q.Blocks, q.Evictions, q.Refusals)
}

func statsOf(s *pegadv1.StatsResponse) *statsResult {
	return &statsResult{
		NodeID:         s.GetNodeId(),
		Incarnation:    s.GetIncarnation(),
		Transport:      s.GetTransport(),
		UptimeSeconds:  seconds(s.GetUptime()),
		PoolSize:       s.GetPoolSize(),
		PoolUsed:       s.GetPoolUsed(),
		PoolFree:       s.GetPoolFree(),
		PoolLocked:     s.GetPoolLocked(),
		Blocks:         s.GetBlocks(),
		PinnedBlocks:   s.GetPinnedBlocks(),
		Evictions:      s.GetEvictions(),
		Eviction:       s.GetEvictionPolicy(),
		EvictionWeight: s.GetEvictionWeight(),
		EvictionSample: s.GetEvictionSamples(),
		SessionsActive: s.GetSessionsActive(),
		LockedBlocks:   s.GetLockedBlocks(),
		LockTimeouts:   s.GetLockTimeouts(),
		Conns:          s.GetConns(),
		QPs:            s.GetQps(),
		FetchesOK:      s.GetFetchesOk(),
		FetchesFailed:  s.GetFetchesFailed(),
		FetchBytes:     s.GetFetchBytes(),
		Lookups:        s.GetLookups(),
		LookupHits:     s.GetLookupHitBlocks(),
		LookupMisses:   s.GetLookupMissBlocks(),
		Recomputed:     s.GetRecomputedBlocks(),
		Ceiling:        ceiling(s.GetLookupHitBlocks(), s.GetLookupMissBlocks(), s.GetRecomputedBlocks()),
		Quotas:         quotasOf(s.GetQuotas()),
	}
}

// ceiling is the daemon's pegaflow_prefix_hit_ratio_ceiling over every
// namespace (metrics.Ceiling, which pegactl must not import: TestDeps):
// (hits + recomputed) / (hits + misses), capped at 1; 0 before the first
// lookup.
func ceiling(hits, misses, recomputed uint64) float64 {
	if hits+misses == 0 {
		return 0
	}
	return min(float64(hits+recomputed)/float64(hits+misses), 1)
}

// hitRatioCeiling is the ceiling with the recomputed count.
func hitRatioCeiling(hits, misses, recomputed uint64) string {
	c := ceiling(hits, misses, recomputed)
	if hits+misses == 0 {
		return "" // no lookup yet: a dash
	}
	return fmt.Sprintf("%.1f%% (%d recomputed blocks)", 100*c, recomputed)
}

// evictionPolicy names the policy; prefix with its climber's weight.
func evictionPolicy(name string, weight float64, samples uint64) string {
	if name != "prefix" {
		return name
	}
	return fmt.Sprintf("%s (frequency weight %.2f after %d samples)", name, weight, samples)
}

// hitRatio is the share of looked-up blocks found, with the counts.
func hitRatio(hits, misses uint64) string {
	if hits+misses == 0 {
		return "" // no lookup yet: a dash
	}
	return fmt.Sprintf("%.1f%% (%d of %d blocks)", 100*float64(hits)/float64(hits+misses), hits, hits+misses)
}

func (r *statsResult) writeTable(w io.Writer) error {
	pct := 0.0
	if r.PoolSize > 0 {
		pct = 100 * float64(r.PoolUsed) / float64(r.PoolSize)
	}
	locked := "no (pages may be swapped; raise LimitMEMLOCK)"
	if r.PoolLocked {
		locked = "yes"
	}
	rows := [][2]string{
		{"NODE", r.NodeID},
		{"INCARNATION", r.Incarnation},
		{"TRANSPORT", r.Transport},
		{"UPTIME", humanSeconds(r.UptimeSeconds)},
		{"POOL SIZE", humanBytes(r.PoolSize)},
		{"POOL USED", fmt.Sprintf("%s (%.1f%%)", humanBytes(r.PoolUsed), pct)},
		{"POOL FREE", humanBytes(r.PoolFree)},
		{"POOL LOCKED", locked},
		{"BLOCKS", fmt.Sprint(r.Blocks)},
		{"PINNED BLOCKS", fmt.Sprint(r.PinnedBlocks)},
		{"EVICTIONS", fmt.Sprint(r.Evictions)},
		{"EVICTION POLICY", evictionPolicy(r.Eviction, r.EvictionWeight, r.EvictionSample)},
		{"SESSIONS ACTIVE", fmt.Sprint(r.SessionsActive)},
		{"LOCKED BLOCKS", fmt.Sprint(r.LockedBlocks)},
		{"LOCK TIMEOUTS", fmt.Sprint(r.LockTimeouts)},
		{"CONNS", fmt.Sprint(r.Conns)},
		{"QPS", fmt.Sprint(r.QPs)},
		{"FETCHES OK", fmt.Sprint(r.FetchesOK)},
		{"FETCHES FAILED", fmt.Sprint(r.FetchesFailed)},
		{"FETCH BYTES", humanBytes(r.FetchBytes)},
		{"LOOKUPS", fmt.Sprint(r.Lookups)},
		{"LOOKUP HIT RATIO", hitRatio(r.LookupHits, r.LookupMisses)},
		{"HIT CEILING", hitRatioCeiling(r.LookupHits, r.LookupMisses, r.Recomputed)},
	}
	for _, q := range r.Quotas {
		rows = append(rows, [2]string{"QUOTA " + q.Prefix, q.String()})
	}
	for _, kv := range rows {
		if _, err := fmt.Fprintf(w, "%s\t%s\n", kv[0], dash(kv[1])); err != nil {
			return err
		}
	}
	return nil
}
