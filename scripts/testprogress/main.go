// Command testprogress turns `go test -json` on stdin into what `make
// test` prints: one line per package as it finishes, a line every
// --every while packages still build or run (a full run is silent for
// minutes otherwise), build errors as they come, and the whole output of
// every package that fails. It exits 1 when any package failed or did not
// build, 0 otherwise; it never changes what the tests do.
//
//	go test -json ./... | go run ./scripts/testprogress --packages N
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// event is the part of a test2json event (and of go test's build events)
// this command reads.
type event struct {
	Action     string
	Package    string
	ImportPath string // build events
	Test       string
	Output     string
	Elapsed    float64
}

// state is what the reader has seen; the ticker reads it too.
type state struct {
	mu      sync.Mutex // guards all below
	started time.Time
	total   int                 // packages expected (--packages); 0: unknown
	done    int                 // packages that passed, failed or were skipped
	failed  []string            // packages that failed or did not build
	running map[string]bool     // packages started and not done
	output  map[string][]string // each running package's output, for a failure
}

func main() {
	total := flag.Int("packages", 0, "number of packages under test (for \"N of M\")")
	every := flag.Duration("every", 30*time.Second, "interval of the progress line")
	flag.Parse()
	s := &state{started: time.Now(), total: *total, running: map[string]bool{}, output: map[string][]string{}}
	stop := make(chan struct{})
	ticked := make(chan struct{})
	go func() { // the ticker: ends when stop closes
		defer close(ticked)
		t := time.NewTicker(*every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				s.progress(os.Stdout)
			}
		}
	}()
	err := s.read(os.Stdin, os.Stdout)
	close(stop)
	<-ticked
	if err != nil {
		fmt.Fprintln(os.Stderr, "testprogress:", err)
		os.Exit(1)
	}
	if !s.summary(os.Stdout) {
		os.Exit(1)
	}
}

// read consumes events until EOF. Lines that are not JSON (go test's own
// errors, e.g. a package that does not exist) are printed as they are.
func (s *state) read(in io.Reader, out io.Writer) error {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			fmt.Fprintln(out, sc.Text())
			continue
		}
		s.apply(e, out)
	}
	return sc.Err()
}

// apply records one event and prints what it finishes.
func (s *state) apply(e event, out io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case e.Action == "build-output":
		fmt.Fprint(out, e.Output)
	case e.Action == "build-fail":
		s.failed = append(s.failed, e.ImportPath+" (build)")
	case e.Test != "":
		if e.Action == "output" {
			s.output[e.Package] = append(s.output[e.Package], e.Output)
		}
	case e.Action == "start":
		s.running[e.Package] = true
	case e.Action == "output":
		s.output[e.Package] = append(s.output[e.Package], e.Output)
	case e.Action == "pass", e.Action == "skip", e.Action == "fail":
		s.done++
		delete(s.running, e.Package)
		word := map[string]string{"pass": "ok  ", "skip": "skip", "fail": "FAIL"}[e.Action]
		if e.Action == "fail" {
			fmt.Fprint(out, strings.Join(s.output[e.Package], ""))
			s.failed = append(s.failed, e.Package)
		}
		fmt.Fprintf(out, "%s %s %.1fs%s\n", word, e.Package, e.Elapsed, s.countLocked())
		delete(s.output, e.Package)
	}
}

// countLocked is " [N/M]" (or " [N]" without a total). s.mu must be held.
func (s *state) countLocked() string {
	if s.total > 0 {
		return fmt.Sprintf(" [%d/%d]", s.done, s.total)
	}
	return fmt.Sprintf(" [%d]", s.done)
}

// progress prints how long the run has gone and what is still running
// (or that packages are still building, before any has started).
func (s *state) progress(out io.Writer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.running))
	for p := range s.running {
		names = append(names, p[strings.LastIndex(p, "/")+1:])
	}
	slices.Sort(names)
	what := "building test binaries"
	if len(names) > 0 {
		what = "running " + strings.Join(names, ", ")
	}
	fmt.Fprintf(out, "... %s, %d packages done%s, %s\n",
		time.Since(s.started).Round(time.Second), s.done, s.countLocked(), what)
}

// summary prints the failed packages, if any; true when none failed.
func (s *state) summary(out io.Writer) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.failed) == 0 {
		fmt.Fprintf(out, "all %d packages passed in %s\n", s.done, time.Since(s.started).Round(time.Second))
		return true
	}
	fmt.Fprintf(out, "FAILED: %s\n", strings.Join(s.failed, ", "))
	return false
}
