package testutil

import (
	"os"
	"testing"
)

// ShortTempDir is a temporary directory with a short path, removed at the
// end of the test: unix socket paths are limited to 108 bytes, and
// t.TempDir embeds the test's name.
func ShortTempDir(t testing.TB) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pegad")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
