package reliability

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// envFull turns on the full suite (make reliability sets it); envTotals
// names a file that receives the totals line (or the skip line), so that
// make can print it last.
const (
	envFull   = "PEGAD_RELIABILITY"
	envTotals = "PEGAD_RELIABILITY_TOTALS"
)

// scenario is one row of the table: the daemons it runs, what it does
// while they run, and what it promises (docs/reliability.md lists both).
type scenario struct {
	name    string
	promise string
	nodes   []nodeSpec
	// loopback: the scenario needs no namespace and also runs in the short
	// form of `make test` (daemons on 127.0.0.1).
	loopback bool
	// flood: a fault client joins from its own namespace (host "f").
	flood bool
	// emptyQueries: some queries may find no block (no session granted),
	// so the ledger can only be checked as ended + active <= granted.
	emptyQueries bool
	// pending names the issue a hook waits for; the row is skipped.
	pending string
	// quietWait bounds how long validation waits for sessions to end.
	quietWait time.Duration
	run       func(c *cluster)
}

// cluster is one scenario's running world.
type cluster struct {
	t     *testing.T
	sc    scenario
	net   *network // nil on loopback
	nodes map[string]*node
	reg   *registry
	hist  *history
	base  map[string]baseline

	mu     sync.Mutex // guards faults, notes
	faults int
	notes  []string
}

func (c *cluster) n(name string) *node { return c.nodes[name] }

func (c *cluster) logf(format string, args ...any) {
	c.t.Helper()
	c.t.Logf(format, args...)
}

// fault counts one injected fault.
func (c *cluster) fault(format string, args ...any) {
	c.t.Helper()
	c.mu.Lock()
	c.faults++
	c.mu.Unlock()
	c.t.Logf("fault: "+format, args...)
}

// note records a figure for the report and docs.
func (c *cluster) note(format string, args ...any) {
	c.t.Helper()
	s := fmt.Sprintf(format, args...)
	c.mu.Lock()
	c.notes = append(c.notes, s)
	c.mu.Unlock()
	c.t.Log("figure: " + s)
}

// require fails the scenario now (validation still runs) when err != nil.
func (c *cluster) require(err error, what string) {
	c.t.Helper()
	if err != nil {
		c.t.Fatalf("%s: %v", what, err)
	}
}

// expect records a broken promise of the scenario without stopping it.
func (c *cluster) expect(ok bool, format string, args ...any) {
	c.t.Helper()
	if !ok {
		c.t.Errorf("broken promise: "+format, args...)
	}
}

// host is the namespace of a node name (nil on loopback).
func (c *cluster) host(name string) *netns {
	if c.net == nil {
		return nil
	}
	return c.net.hosts[name]
}

// result is one scenario's line of the report.
type result struct {
	name     string
	faults   int
	verified int64
	wrong    int
	leaked   int
	took     time.Duration
	skipped  string
	failed   bool
	notes    []string
}

// suite runs a table and totals it.
type suite struct {
	mu      sync.Mutex // guards results
	results []result
}

func (s *suite) add(r result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.results = append(s.results, r)
}

// totals is the one line `make reliability` ends with.
func (s *suite) totals() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n, faults, wrong, leaked int
	var verified int64
	for _, r := range s.results {
		if r.skipped != "" {
			continue
		}
		n++
		faults += r.faults
		verified += r.verified
		wrong += r.wrong
		leaked += r.leaked
	}
	return fmt.Sprintf("reliability: %d scenarios, %d faults, %d bytes verified, %d wrong, %d leaked", n, faults, verified, wrong, leaked)
}

// table prints one line per scenario (the docs' table is copied from it).
func (s *suite) table() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "| scenario | result | time | faults | bytes verified | wrong | leaked | figures |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range s.results {
		if r.skipped != "" {
			fmt.Fprintf(&b, "| %s | skipped: %s | | | | | | |\n", r.name, r.skipped)
			continue
		}
		res := "pass"
		if r.failed {
			res = "FAIL"
		}
		fmt.Fprintf(&b, "| %s | %s | %.1fs | %d | %d | %d | %d | %s |\n", r.name, res, r.took.Seconds(), r.faults, r.verified, r.wrong, r.leaked, strings.Join(r.notes, "; "))
	}
	return b.String()
}

// runScenario builds sc's world, runs it, validates, stops every daemon
// with SIGTERM (each must exit 0) and removes everything it made.
func (s *suite) runScenario(t *testing.T, sc scenario, useNetns bool, idx int) {
	if sc.pending != "" {
		s.add(result{name: sc.name, skipped: sc.pending})
		t.Skipf("hook: waits for %s", sc.pending)
	}
	buildBinaries(t)
	c := &cluster{t: t, sc: sc, nodes: map[string]*node{}, reg: newRegistry(uint64(idx + 1)), hist: &history{}, base: map[string]baseline{}}
	if useNetns {
		c.net = newNetwork(t, idx)
	}
	t0 := time.Now()
	var maxLock time.Duration
	for _, spec := range sc.nodes {
		var h *netns
		if c.net != nil {
			h = c.net.addHost(t, spec.name)
		}
		n := newNode(t, spec, h)
		c.nodes[spec.name] = n
		maxLock = max(maxLock, n.spec.lockTimeout)
	}
	if sc.flood && c.net != nil {
		c.net.addHost(t, "f")
	}
	for _, spec := range sc.nodes {
		n := c.nodes[spec.name]
		n.start(t)
		c.require(c.takeBaseline(n), "baseline of "+spec.name)
	}
	wait := sc.quietWait
	if wait == 0 {
		wait = maxLock + 3*time.Second
	}
	// Validation runs even when the scenario stopped at a t.Fatal.
	defer func() {
		verified, wrong, leaked, problems := c.validate(wait)
		for _, name := range sortedNames(c.nodes) {
			if err := c.nodes[name].stop(); err != nil {
				problems = append(problems, "SIGTERM: "+err.Error())
				leaked++
			}
		}
		r := result{name: sc.name, faults: c.faults, verified: verified, wrong: wrong, leaked: leaked, took: time.Since(t0), notes: c.notes}
		if wrong > 0 || leaked > 0 || len(problems) > 0 {
			t.Errorf("%s: %d wrong, %d leaked: %s", sc.name, wrong, leaked, summary(problems))
		}
		r.failed = t.Failed()
		s.add(r)
		t.Logf("%s: %d faults, %d bytes verified, %d wrong, %d leaked in %.1fs", sc.name, r.faults, r.verified, r.wrong, r.leaked, r.took.Seconds())
	}()
	sc.run(c)
}

func sortedNames(m map[string]*node) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestReliability is the full suite: every scenario of the table, each in
// its own network namespaces. `make reliability` runs it; one scenario
// alone: make reliability RUN=holder-kill9.
func TestReliability(t *testing.T) {
	if os.Getenv(envFull) == "" {
		t.Skipf("the full suite runs with %s=1 (make reliability)", envFull)
	}
	writeLine := func(line string) {
		if f := os.Getenv(envTotals); f != "" {
			if err := os.WriteFile(f, []byte(line+"\n"), 0o644); err != nil {
				t.Error(err)
			}
		}
	}
	if why := netnsSupport(); why != "" {
		writeLine("reliability: SKIP: " + why)
		t.Skip("reliability: SKIP: " + why)
	}
	if gone := sweepStale(); len(gone) > 0 {
		t.Logf("removed stale namespaces of earlier runs: %s", strings.Join(gone, " "))
	}
	haveNetem = netemSupported()
	t.Logf("sch_netem available: %v", haveNetem)
	s := &suite{}
	for i, sc := range scenarios() {
		t.Run(sc.name, func(t *testing.T) { s.runScenario(t, sc, true, i) })
	}
	if left := leftover(); len(left) > 0 {
		t.Errorf("namespaces left after cleanup: %s", strings.Join(left, " "))
	}
	t.Logf("\n%s", s.table())
	line := s.totals()
	if t.Failed() {
		line += " (FAILED)"
	}
	writeLine(line)
	t.Log(line)
}

// TestReliabilityShort is the short form `make test` runs: the scenarios
// that need no namespace, on loopback.
func TestReliabilityShort(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs real daemons")
	}
	if os.Getenv(envFull) != "" {
		t.Skip("the full suite runs instead")
	}
	s := &suite{}
	for i, sc := range scenarios() {
		if !sc.loopback || sc.pending != "" {
			continue
		}
		t.Run(sc.name, func(t *testing.T) { s.runScenario(t, sc, false, i) })
	}
	t.Log(s.totals())
}

// haveNetem: sch_netem is available (probed once by TestReliability).
var haveNetem bool

// peerClient is a raw PeerService client dialled from host h (a flooder or
// a hostile peer), closed at cleanup.
func peerClient(t testing.TB, h *netns, addr string) pegadv1.PeerServiceClient {
	t.Helper()
	conn, err := grpc.NewClient("passthrough:///"+addr,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) { return h.dial(ctx, "tcp", a) }))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return pegadv1.NewPeerServiceClient(conn)
}

// TestDocsListEveryScenario keeps docs/reliability.md true: every row of
// the table has its line there.
func TestDocsListEveryScenario(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "reliability.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, sc := range scenarios() {
		if !strings.Contains(string(b), "| "+sc.name+" |") {
			t.Errorf("docs/reliability.md has no row for scenario %s", sc.name)
		}
	}
}
