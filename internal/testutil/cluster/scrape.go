package cluster

import (
	"bufio"
	"io"
	"net/http"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/testutil"
)

// scrapeClient reads /metrics without keep-alives, so no client goroutine
// outlives a scrape (goleak), and gives up after 10 s.
var scrapeClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}

// Scrape reads http://addr/metrics as "name{labels}" → value. An error
// fails the test.
func Scrape(t testing.TB, addr string) map[string]float64 {
	t.Helper()
	m, err := testutil.ScrapeMetrics(scrapeClient, addr)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return m
}

// ScrapeText is the /metrics page of addr as text, or "" when it cannot be
// read (a caller polls until it can).
func ScrapeText(addr string) string {
	resp, err := scrapeClient.Get("http://" + addr + "/metrics")
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// Family is one metric family of a /metrics page.
type Family struct {
	Type   string   // its # TYPE
	Labels []string // label names of its first sample, sorted (le and quantile dropped)
}

var labelName = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)

// ScrapeFamilies reads http://addr/metrics and returns its families by
// name (a histogram's _bucket, _sum and _count samples count as the
// family's). An error fails the test.
func ScrapeFamilies(t testing.TB, addr string) map[string]Family {
	t.Helper()
	resp, err := scrapeClient.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	out := map[string]Family{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if f, ok := strings.CutPrefix(line, "# TYPE "); ok {
			name, typ, _ := strings.Cut(f, " ")
			out[name] = Family{Type: typ}
			continue
		}
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if base, ok := strings.CutSuffix(name, suf); ok && out[base].Type == "histogram" {
				name = base
			}
		}
		f, ok := out[name]
		if !ok || f.Labels != nil {
			continue
		}
		f.Labels = []string{}
		if lbl, _, ok := strings.Cut(rest, "}"); ok {
			for _, m := range labelName.FindAllStringSubmatch(lbl, -1) {
				if m[1] != "le" && m[1] != "quantile" {
					f.Labels = append(f.Labels, m[1])
				}
			}
		}
		sort.Strings(f.Labels)
		out[name] = f
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	return out
}
