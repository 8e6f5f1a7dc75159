//go:build linux && cgo && !noverbs

package verbs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// systemVerbsHeader is where Debian's libibverbs-dev (and every other
// distribution's rdma-core-devel) installs the declarations.
const systemVerbsHeader = "/usr/include/infiniband/verbs.h"

// cc returns the C compiler cgo uses, split into its words.
func cc(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "env", "CC").Output()
	if err != nil {
		t.Fatalf("go env CC: %v", err)
	}
	words := strings.Fields(string(out))
	if len(words) == 0 {
		words = []string{"cc"}
	}
	return words
}

func runCC(t *testing.T, args ...string) []byte {
	t.Helper()
	words := cc(t)
	cmd := exec.Command(words[0], append(words[1:], args...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", words[0], strings.Join(args, " "), err, out)
	}
	return out
}

// TestCarriedHeadersBuildAlone proves the package's C side needs no system
// verbs header: the shim and the fake compile with only include/ on the
// path. It runs on every host with a C compiler.
func TestCarriedHeadersBuildAlone(t *testing.T) {
	for _, src := range []string{"shim.c", "fakeverbs.c"} {
		// -H lists every header the compiler opens, one per line with
		// leading dots: none of the verbs ones may come from the system.
		out := runCC(t, "-fsyntax-only", "-Wall", "-Werror", "-H", "-Iinclude", src)
		carried := 0
		for _, line := range strings.Split(string(out), "\n") {
			h := strings.TrimLeft(line, ". ")
			if !strings.Contains(h, "/infiniband/") && !strings.Contains(h, "rdma/ib_user") {
				continue
			}
			if !strings.HasPrefix(h, "include/") {
				t.Errorf("%s reads %s from outside the carried include/", src, h)
			}
			carried++
		}
		if carried < 4 {
			t.Errorf("%s: compiler opened %d carried verbs headers, want the 4 in include/:\n%s", src, carried, out)
		}
	}
}

// TestCarriedHeadersMatchSystem compiles the shim against the system's
// rdma-core headers where they are installed, and an ABI probe against both
// header sets: every struct size, field offset and constant the provider
// relies on must be identical, or the carried copy is out of date.
func TestCarriedHeadersMatchSystem(t *testing.T) {
	if _, err := os.Stat(systemVerbsHeader); err != nil {
		t.Skipf("%s not installed (libibverbs-dev / rdma-core-devel): nothing to compare the carried headers with", systemVerbsHeader)
	}
	// Against the system headers: shim.h's #include <infiniband/verbs.h>
	// resolves to /usr/include when include/ is not on the path.
	for _, src := range []string{"shim.c", "fakeverbs.c"} {
		runCC(t, "-fsyntax-only", "-Wall", src)
	}
	dir := t.TempDir()
	probe := func(name string, extra ...string) []byte {
		bin := filepath.Join(dir, name)
		runCC(t, append(extra, "-o", bin, filepath.Join("testdata", "abiprobe.c"))...)
		out, err := exec.Command(bin).Output()
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		return out
	}
	carried := probe("carried", "-Iinclude")
	system := probe("system")
	if !bytes.Equal(carried, system) {
		cl, sl := strings.Split(string(carried), "\n"), strings.Split(string(system), "\n")
		for i := range min(len(cl), len(sl)) {
			if cl[i] != sl[i] {
				t.Errorf("carried %q, system %q", cl[i], sl[i])
			}
		}
		if len(cl) != len(sl) {
			t.Errorf("carried probe printed %d lines, system %d", len(cl), len(sl))
		}
	}
	if n := bytes.Count(carried, []byte("\n")); n < 100 {
		t.Fatalf("ABI probe printed only %d lines", n)
	}
}
