package daemon_test

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// --debug-listen serves pprof, goes away at Close, and is off by default.
func TestDebugListenServesPprof(t *testing.T) {
	get := func(url string) (int, string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}

	off := startNode(t, testConfig(t))
	if a := off.d.DebugAddr(); a != "" {
		t.Fatalf("debug endpoint on by default at %s", a)
	}

	cfg := testConfig(t)
	cfg.DebugListen = "127.0.0.1:0"
	n := startNode(t, cfg)
	base := "http://" + n.d.DebugAddr()
	for _, tc := range []struct{ path, want string }{
		{"/debug/pprof/", "goroutine"},
		{"/debug/pprof/goroutine?debug=1", "goroutine profile:"},
		{"/debug/pprof/cmdline", ""},
		{"/debug/pprof/heap?debug=1", "heap profile:"},
	} {
		code, body, err := get(base + tc.path)
		if err != nil || code != http.StatusOK || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s: %d %v, body %.80q (want it to contain %q)", tc.path, code, err, body, tc.want)
		}
	}
	if code, _, err := get(base + "/metrics"); err != nil || code != http.StatusNotFound {
		t.Errorf("GET /metrics on the debug port: %d %v, want 404 (its own mux)", code, err)
	}
	if err := n.d.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := get(base + "/debug/pprof/"); err == nil {
		t.Errorf("debug endpoint still answers after Close")
	}
}
