package main

import (
	"strings"
	"testing"
	"time"
)

// TestRead: a passing package is one line; a failing one prints its
// output then its line and is named in the summary; build errors pass
// through at once; text that is not JSON is printed as it is.
func TestRead(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"start","Package":"m/a"}`,
		`{"Action":"output","Package":"m/a","Test":"TestA","Output":"=== RUN   TestA\n"}`,
		`{"Action":"pass","Package":"m/a","Elapsed":1.25}`,
		`{"Action":"start","Package":"m/b"}`,
		`{"Action":"output","Package":"m/b","Test":"TestB","Output":"    b_test.go:9: boom\n"}`,
		`{"Action":"output","Package":"m/b","Output":"FAIL\n"}`,
		`{"Action":"fail","Package":"m/b","Elapsed":0.5}`,
		`{"ImportPath":"m/c [m/c.test]","Action":"build-output","Output":"c.go:1: syntax error\n"}`,
		`{"ImportPath":"m/c [m/c.test]","Action":"build-fail"}`,
		`no Go files in /x`,
	}, "\n")
	s := &state{started: time.Now(), total: 3, running: map[string]bool{}, output: map[string][]string{}}
	var out strings.Builder
	if err := s.read(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	want := "ok   m/a 1.2s [1/3]\n" +
		"    b_test.go:9: boom\nFAIL\nFAIL m/b 0.5s [2/3]\n" +
		"c.go:1: syntax error\n" +
		"no Go files in /x\n"
	if out.String() != want {
		t.Fatalf("output:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	if s.summary(&out) || !strings.Contains(out.String(), "FAILED: m/b, m/c [m/c.test] (build)") {
		t.Fatalf("summary %q, want both failures", out.String())
	}
	out.Reset()
	s.running["m/d"] = true
	s.progress(&out)
	if !strings.Contains(out.String(), "2 packages done [2/3], running d") {
		t.Fatalf("progress %q", out.String())
	}
}
