package daemon_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/metrics"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
	"github.com/pegaflow/pegad/internal/version"
)

// TestFreshNodeMetrics: a node that has done nothing yet already exports
// every series an operator's alert or dashboard subtracts or rates, at zero,
// plus build and transport info.
func TestFreshNodeMetrics(t *testing.T) {
	n := startNode(t, testConfig(t))
	m := cluster.Scrape(t, n.d.MetricsAddr())
	want := map[string]float64{
		"pegaflow_holder_sessions_granted_total":                                  0,
		"pegaflow_holder_oldest_session_age_seconds":                              0,
		"pegaflow_holder_empty_queries_total":                                     0,
		"pegaflow_transfer_lock_timeouts_total":                                   0,
		`pegaflow_rdma_fetch_total{status="ok"}`:                                  0,
		`pegaflow_rdma_fetch_total{status="error"}`:                               0,
		`pegaflow_rdma_fetch_errors_total{class="connection"}`:                    0,
		`pegaflow_rdma_connections{role="holder",state="connected"}`:              0,
		`pegaflow_rdma_handshakes_total{result="ok",role="requester"}`:            0,
		`pegaflow_rdma_connection_invalidations_total{reason="completion_error"}`: 0,
		`pegaflow_rdma_work_completions_total{status="retry_exc_err"}`:            0,
		`pegaflow_transport_info{reason="requested",transport="tcp"}`:             1,
		fmt.Sprintf(`pegaflow_build_info{commit=%q,goversion=%q,version=%q}`,
			version.CommitOrVCS(), version.GoVersion(), version.Version): 1,
	}
	// The deprecated names (metrics.Deprecated) carry the same series for
	// one release.
	for k, v := range want {
		name, labels, _ := strings.Cut(k, "{")
		for old, now := range metrics.Deprecated {
			if name == now {
				want[old+"{"+labels] = v
			}
		}
	}
	for _, o := range metrics.Outcomes {
		want[`pegaflow_holder_session_ends_total{outcome="`+o+`"}`] = 0
	}
	for _, rpc := range metrics.RPCs {
		want[`pegaflow_holder_rpc_total{code="OK",rpc="`+rpc+`"}`] = 0
	}
	for k, v := range want {
		got, ok := m[k]
		if !ok {
			t.Errorf("fresh node: no series %s", k)
		} else if got != v {
			t.Errorf("fresh node: %s = %v, want %v", k, got, v)
		}
	}
	// One pool part (no NUMA split): its node label is where the kernel
	// put the pages (-1 on a host without NUMA).
	var parts []string
	for k, v := range m {
		if strings.HasPrefix(k, "pegaflow_pool_part_size_bytes{") {
			parts = append(parts, k)
			if !strings.Contains(k, `part="0"`) || v != float64(n.d.Config().PoolSize) {
				t.Errorf("%s = %v, want part 0 of %d bytes", k, v, n.d.Config().PoolSize)
			}
		}
	}
	if len(parts) != 1 {
		t.Errorf("pool part series %v, want one", parts)
	}
}

// TestLeakedSessionsShowBeforeTimeout: requesters that die between their
// query and their release (kill -9: the holder answered, nothing ever
// releases) show on the holder at once as granted − ended rising, per
// requester, with the oldest session's age growing, long before any lock
// times out. A query that locks nothing is counted apart.
func TestLeakedSessionsShowBeforeTimeout(t *testing.T) {
	cfg := testConfig(t)
	cfg.LockTimeout = time.Hour
	n := startNode(t, cfg)
	ctx := ctxT(t)
	for i := range 4 {
		putBlock(t, n, "ns", []byte{byte(i + 1)}, []byte("block-body"), false)
	}
	addr := n.d.MetricsAddr()
	leaked := func(m map[string]float64) float64 {
		ended := 0.0
		for _, o := range metrics.Outcomes {
			ended += m[`pegaflow_holder_session_ends_total{outcome="`+o+`"}`]
		}
		return m["pegaflow_holder_sessions_granted_total"] - ended
	}
	// A requester that releases leaves no deficit.
	live := &pegadv1.Requester{NodeId: "req-live", Incarnation: "i1"}
	q, err := n.peer.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{{1}}, Requester: live})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.peer.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{SessionId: q.SessionId, Requester: live}); err != nil {
		t.Fatal(err)
	}
	if d := leaked(cluster.Scrape(t, addr)); d != 0 {
		t.Fatalf("granted − ended = %v after a released session, want 0", d)
	}
	// Two requesters die holding three sessions.
	dead := []*pegadv1.Requester{{NodeId: "req-dead-1", Incarnation: "a"}, {NodeId: "req-dead-2", Incarnation: "b"}, {NodeId: "req-dead-1", Incarnation: "a"}}
	for i, r := range dead {
		if _, err := n.peer.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{{byte(i + 2)}}, Requester: r}); err != nil {
			t.Fatal(err)
		}
		if d := leaked(cluster.Scrape(t, addr)); d != float64(i+1) {
			t.Fatalf("after %d abandoned sessions granted − ended = %v", i+1, d)
		}
	}
	// And a query for blocks the holder lacks locks nothing.
	if _, err := n.peer.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{{99}}, Requester: live}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(50 * time.Millisecond)
	m := cluster.Scrape(t, addr)
	for k, v := range map[string]float64{
		`pegaflow_holder_sessions_live_by_requester{requester="req-dead-1"}`: 2,
		`pegaflow_holder_sessions_live_by_requester{requester="req-dead-2"}`: 1,
		`pegaflow_holder_sessions_live_by_requester{requester="req-live"}`:   0,
		"pegaflow_holder_empty_queries_total":                                1,
		"pegaflow_holder_sessions_granted_total":                             4,
		`pegaflow_holder_session_ends_total{outcome="released"}`:             1,
		"pegaflow_transfer_lock_timeouts_total":                              0,
		"pegaflow_transfer_sessions_active":                                  3,
	} {
		if m[k] != v {
			t.Errorf("%s = %v, want %v", k, m[k], v)
		}
	}
	if age := m["pegaflow_holder_oldest_session_age_seconds"]; age <= 0 || age > 60 {
		t.Errorf("oldest session age = %v s, want a small positive age", age)
	}
	// A force-release ends one as "forced".
	sess, err := n.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{IncludeBlocks: true})
	if err != nil || len(sess.GetSessions()) != 3 {
		t.Fatalf("sessions: %v, %v", sess, err)
	}
	// pegactl locks list: each session names the block it locked.
	for _, s := range sess.Sessions {
		if l := s.GetLocked(); len(l) != 1 || l[0].GetNamespace() != "ns" || len(l[0].GetHash()) != 1 || l[0].GetBytes() != uint64(len("block-body")) {
			t.Errorf("session %s locked %v", s.GetSessionId(), l)
		}
	}
	if _, err := n.admin.ReleaseLock(ctx, &pegadv1.ReleaseLockRequest{SessionId: sess.Sessions[0].GetSessionId()}); err != nil {
		t.Fatal(err)
	}
	m = cluster.Scrape(t, addr)
	if m[`pegaflow_holder_session_ends_total{outcome="forced"}`] != 1 || leaked(m) != 2 {
		t.Fatalf("after a force-release: forced %v, granted − ended %v", m[`pegaflow_holder_session_ends_total{outcome="forced"}`], leaked(m))
	}
}

// readmeMetricRow matches a row of README.md's metric table.
var readmeMetricRow = regexp.MustCompile("^\\| (`pegad?[a-z_]*(?:\\{[a-z_,]*\\})?`(?:, `pegad?[a-z_]*(?:\\{[a-z_,]*\\})?`)*) \\| ([a-z]+) \\|(.*)\\|$")

// TestReadmeMetricTable: README.md's metric table lists exactly the pegad
// families a live node exports (pegaflow_*, pegad_*), each with its type
// and label names, and the rpc values of pegaflow_holder_rpc_total.
func TestReadmeMetricTable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.NamespaceQuota = []string{"ns=1MiB"} // the quota families have series
	n := startNode(t, cfg)
	// One granted session makes the per-requester family appear.
	putBlock(t, n, "ns", []byte{1}, []byte("x"), false)
	if _, err := n.peer.QueryBlocksForTransfer(ctxT(t), &pegadv1.QueryBlocksForTransferRequest{Namespace: "ns", Hashes: [][]byte{{1}},
		Requester: &pegadv1.Requester{NodeId: "r", Incarnation: "i"}}); err != nil {
		t.Fatal(err)
	}
	live := cluster.ScrapeFamilies(t, n.d.MetricsAddr())

	documented := map[string]bool{}
	for _, line := range strings.Split(string(readme), "\n") {
		row := readmeMetricRow.FindStringSubmatch(line)
		if row == nil {
			continue
		}
		for _, cell := range strings.Split(row[1], ", ") {
			cell = strings.Trim(cell, "`")
			name, lbl, _ := strings.Cut(strings.TrimSuffix(cell, "}"), "{")
			documented[name] = true
			f, ok := live[name]
			switch {
			case !ok:
				t.Errorf("README lists %s; a live node does not export it", name)
				continue
			case f.Type != row[2]:
				t.Errorf("README: %s is a %s; live it is a %s", name, row[2], f.Type)
			}
			var labels []string
			if lbl != "" {
				labels = strings.Split(lbl, ",")
			}
			sort.Strings(labels)
			if !slices.Equal(labels, f.Labels) && !(len(labels) == 0 && len(f.Labels) == 0) {
				t.Errorf("README: %s has labels %v; live %v", name, labels, f.Labels)
			}
			if name == "pegaflow_holder_rpc_total" {
				for _, rpc := range metrics.RPCs {
					if !strings.Contains(row[3], "`"+rpc+"`") {
						t.Errorf("README: pegaflow_holder_rpc_total row misses rpc %q", rpc)
					}
				}
			}
		}
	}
	if len(documented) == 0 {
		t.Fatal("no metric table found in README.md")
	}
	for name := range live {
		if now, ok := metrics.Deprecated[name]; ok {
			// Not a row: the note under the table names it and its
			// replacement, which is a row.
			if documented[name] || !documented[now] || !strings.Contains(string(readme), "`"+name+"`") {
				t.Errorf("README: deprecated %s must be named in the rename note, not the table, and %s be a row", name, now)
			}
			continue
		}
		if (strings.HasPrefix(name, "pegaflow_") || strings.HasPrefix(name, "pegad_")) && !documented[name] {
			t.Errorf("live metric %s is missing from README.md's table", name)
		}
	}
}

// TestMetricNames (issue 33 item 10): every pegad family is pegaflow_*;
// the only others are the deprecated names metrics.Deprecated keeps for
// one release, each a copy of its replacement (same type, labels and
// series) whose help says so. The dashboards and alerts shipped under
// deploy/ name no deprecated family.
func TestMetricNames(t *testing.T) {
	n := startNode(t, testConfig(t))
	live := cluster.ScrapeFamilies(t, n.d.MetricsAddr())
	m := cluster.Scrape(t, n.d.MetricsAddr())
	for name, f := range live {
		if strings.HasPrefix(name, "pegaflow_") || strings.HasPrefix(name, "grpc_") ||
			strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") || strings.HasPrefix(name, "promhttp_") {
			continue
		}
		now, ok := metrics.Deprecated[name]
		if !ok {
			t.Errorf("family %s is neither pegaflow_* nor a deprecated name", name)
			continue
		}
		nf, ok := live[now]
		if !ok || nf.Type != f.Type || !slices.Equal(nf.Labels, f.Labels) {
			t.Errorf("deprecated %s (%s %v) is not a copy of %s (%+v)", name, f.Type, f.Labels, now, nf)
		}
		var series int
		for k, v := range m {
			if rest, ok := strings.CutPrefix(k, now+"{"); ok {
				series++
				if m[name+"{"+rest] != v {
					t.Errorf("%s{%s = %v, but the deprecated %s has %v", now, rest, v, name, m[name+"{"+rest])
				}
			}
		}
		if series == 0 {
			t.Errorf("%s has no series", now)
		}
	}
	page := cluster.ScrapeText(n.d.MetricsAddr())
	for old, now := range metrics.Deprecated {
		if !strings.Contains(page, "# HELP "+old+" Deprecated: use "+now) {
			t.Errorf("the help of %s does not say it is deprecated for %s", old, now)
		}
	}
	for _, dir := range []string{"../../deploy/grafana", "../../deploy/prometheus", "../../deploy/helm/pegad/files"} {
		files, err := filepath.Glob(filepath.Join(dir, "*"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: %v files (%v)", dir, len(files), err)
		}
		for _, f := range files {
			b, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for old, now := range metrics.Deprecated {
				if strings.Contains(string(b), old) {
					t.Errorf("%s names the deprecated %s: use %s", f, old, now)
				}
			}
		}
	}
}
