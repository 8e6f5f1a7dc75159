package metrics

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoProductionNewForTest: no production file makes metrics on a
// private registry (NewForTest, or the *ForTest helpers that were here) as
// a default: metrics are a required option, and private registries are
// metricstest's, for tests.
func TestNoProductionNewForTest(t *testing.T) {
	root := filepath.Join("..", "..")
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != root && (strings.HasPrefix(n, ".") || n == "bin" || n == "testdata" || n == "clients") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, f := range []string{"NewForTest(", "NewTierForTest(", "NewClusterForTest(", "NewKVEventsForTest("} {
			if strings.Contains(string(b), f) {
				t.Errorf("%s (not a test) calls %s: production code takes its metrics from the daemon (tests: metricstest)", rel, strings.TrimSuffix(f, "("))
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
