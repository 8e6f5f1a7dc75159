// Package replay replays prefix-cache traces: through cache simulators
// (plain LRU and Belady's offline optimum) and through a running pegad,
// driven as an inference engine would drive it through the local client.
// It owns the trace format (Mooncake's JSONL) and the hit accounting; it
// never starts or configures a daemon: the caller sizes the pool.
package replay

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
)

// Request is one line of a trace: an inference request whose prompt is the
// chain of blocks HashIDs (requests that share a prefix share its ids).
type Request struct {
	Timestamp    int64    `json:"timestamp"` // arrival, ms
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
}

// The traces in testdata (testdata/README.md), by file name.
const (
	SyntheticTrace = "mooncake_fast25_synthetic_trace.jsonl.gz"
	ArxivTrace     = "mooncake_arxiv_trace_slice.jsonl.gz"
)

// maxLine bounds one JSONL line: 1 MiB holds ~100k block ids, far past any
// prompt a trace has.
const maxLine = 1 << 20

// ReadTraceFile reads the JSONL trace in the file at path, gunzipped when
// its name ends in .gz.
func ReadTraceFile(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	reqs, err := ReadTrace(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return reqs, nil
}

// ReadTrace reads a JSONL trace: one Request per line, blank lines skipped.
// A line that is not a request is an error naming the line.
func ReadTrace(r io.Reader) ([]Request, error) {
	var out []Request
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		var req Request
		dec := json.NewDecoder(strings.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", n, err)
		}
		if dec.More() {
			return nil, fmt.Errorf("trace line %d: more than one JSON value", n)
		}
		if len(req.HashIDs) == 0 {
			return nil, fmt.Errorf("trace line %d: no hash_ids", n)
		}
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("trace: no requests")
	}
	return out, nil
}

// Stats counts a trace's block accesses and distinct blocks.
func Stats(reqs []Request) (accesses, unique int) {
	seen := make(map[uint64]struct{})
	for _, r := range reqs {
		accesses += len(r.HashIDs)
		for _, h := range r.HashIDs {
			seen[h] = struct{}{}
		}
	}
	return accesses, len(seen)
}

// Chains is each request's block ids, in trace order: what a simulator
// of a pegad policy (evict.Simulate) replays.
func Chains(reqs []Request) [][]uint64 {
	out := make([][]uint64, len(reqs))
	for i, r := range reqs {
		out[i] = r.HashIDs
	}
	return out
}
