package main

import (
	"bufio"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// fakeTag is the build tag that compiles the verbs provider's fake HCA
// (internal/ibv/verbs: fakeverbs.c, fake_cgo.go, fakemw_cgo.go) for tests.
const fakeTag = "pegad_fakeverbs"

// fakeFiles are the verbs package's files that only fakeTag builds.
var fakeFiles = []string{"fakeverbs.c", "fake_cgo.go", "fakemw_cgo.go"}

// goTool is the go command, or a skip where there is none.
func goTool(t *testing.T) string {
	t.Helper()
	g, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("go command not found: %v", err)
	}
	out, err := exec.Command(g, "env", "CGO_ENABLED").Output()
	if err != nil || strings.TrimSpace(string(out)) != "1" {
		t.Skipf("cgo is off (%q, %v): the verbs provider, fake or not, is not built", out, err)
	}
	return g
}

// TestFakeHCAOnlyUnderTag: the verbs package's fake files are built with
// -tags pegad_fakeverbs and only then (go list, as the build sees them).
// -tags on the command line overrides any in GOFLAGS.
func TestFakeHCAOnlyUnderTag(t *testing.T) {
	g := goTool(t)
	files := func(tags string) []string {
		out, err := exec.Command(g, "list", "-tags="+tags, "-f", "{{range .GoFiles}}{{.}} {{end}}{{range .CgoFiles}}{{.}} {{end}}{{range .CFiles}}{{.}} {{end}}",
			"github.com/pegaflow/pegad/internal/ibv/verbs").CombinedOutput()
		if err != nil {
			t.Fatalf("go list -tags=%s: %v\n%s", tags, err, out)
		}
		return strings.Fields(string(out))
	}
	prod, test := files(""), files(fakeTag)
	if !slices.Contains(prod, "lib_cgo.go") || !slices.Contains(prod, "shim.c") {
		t.Fatalf("production build of verbs lacks the cgo provider: %v", prod)
	}
	for _, f := range fakeFiles {
		if slices.Contains(prod, f) {
			t.Errorf("production build of verbs compiles %s", f)
		}
		if !slices.Contains(test, f) {
			t.Errorf("-tags %s does not compile %s: %v", fakeTag, f, test)
		}
	}
}

// TestProductionBuildHasNoFakeHCA builds bin/pegad as `make build` and the
// image do (no tags) and checks its symbol table: the fake HCA's C code
// (pv_fake_*) and Go controls (verbs.Fake*, verbs.SetFake*) are absent,
// while the provider's shim is there. The same check on a build with the
// test tag must find the fake, so the check can see it.
func TestProductionBuildHasNoFakeHCA(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: builds pegad twice")
	}
	g := goTool(t)
	dir := t.TempDir()
	build := func(tags string) (fake []string, shim bool) {
		t.Helper()
		bin := filepath.Join(dir, "pegad"+tags)
		if out, err := exec.Command(g, "build", "-tags="+tags, "-o", bin, ".").CombinedOutput(); err != nil {
			t.Fatalf("go build -tags=%s: %v\n%s", tags, err, out)
		}
		f, err := elf.Open(bin)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		syms, err := f.Symbols()
		if err != nil {
			t.Fatalf("%s: %v", bin, err)
		}
		for _, s := range syms {
			switch {
			case s.Name == "pv_open":
				shim = true
			case isFakeSymbol(s.Name):
				fake = append(fake, s.Name)
			}
		}
		return fake, shim
	}
	fake, shim := build("")
	if !shim {
		t.Fatal("pegad has no pv_open: the verbs provider is not in the binary, so this check proves nothing")
	}
	if len(fake) > 0 {
		t.Fatalf("production pegad has %d fake HCA symbols: %v", len(fake), fake)
	}
	if fake, _ := build(fakeTag); !slices.Contains(fake, "pv_fake_lib") {
		t.Fatalf("pegad built with -tags %s: no pv_fake_lib among %v; the check cannot see the fake", fakeTag, fake)
	}
}

// isFakeSymbol: a symbol of the fake HCA, C (pv_fake_*, and cgo's
// _cgo_*_Cfunc_pv_fake_* wrappers) or Go.
func isFakeSymbol(name string) bool {
	if strings.Contains(name, "pv_fake_") {
		return true
	}
	const pkg = "github.com/pegaflow/pegad/internal/ibv/verbs."
	i := strings.Index(name, pkg)
	if i < 0 {
		return false
	}
	rest := name[i+len(pkg):]
	return strings.HasPrefix(rest, "Fake") || strings.HasPrefix(rest, "SetFake") || strings.HasPrefix(rest, "setFake")
}

// TestReleaseBuildsPassNoTestTag: the Makefile's build and nocgo targets
// and the image's go build name no build tags, so they build what
// TestProductionBuildHasNoFakeHCA checked.
func TestReleaseBuildsPassNoTestTag(t *testing.T) {
	root := filepath.Join("..", "..")
	check := func(file string, want int, isBuild func(string) bool) {
		t.Helper()
		f, err := os.Open(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		n := 0
		sc := bufio.NewScanner(f)
		for line := ""; sc.Scan(); line = "" {
			line += sc.Text()
			for strings.HasSuffix(line, "\\") && sc.Scan() { // a command continued
				line = strings.TrimSuffix(line, "\\") + sc.Text()
			}
			if !isBuild(line) {
				continue
			}
			n++
			if strings.Contains(line, "-tags") || strings.Contains(line, fakeTag) || strings.Contains(line, "TEST_TAGS") {
				t.Errorf("%s: a build line passes tags: %s", file, strings.TrimSpace(line))
			}
		}
		if err := sc.Err(); err != nil {
			t.Fatal(err)
		}
		if n < want {
			t.Errorf("%s: %d go build lines, want at least %d (did they move?)", file, n, want)
		}
	}
	// build: bin/pegad and bin/pegactl; nocgo: CGO_ENABLED=0 go build ./...
	check("Makefile", 3, func(l string) bool {
		return strings.Contains(l, "$(GO) build") && strings.Contains(l, "./cmd/") || strings.Contains(l, "CGO_ENABLED=0 $(GO) build")
	})
	check(filepath.Join("deploy", "image", "Dockerfile"), 1, func(l string) bool { return strings.Contains(l, "go build") })
}

// TestProductionDepsLackTestHelpers: pegad and pegactl import none of
// the module's test helpers (metricstest's private registries, ibvtest,
// testutil): production constructors take what tests would fake.
func TestProductionDepsLackTestHelpers(t *testing.T) {
	g := goTool(t)
	out, err := exec.Command(g, "list", "-tags=", "-deps", ".", "../pegactl").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const module = "github.com/pegaflow/pegad/"
	n := 0
	for _, dep := range strings.Fields(string(out)) {
		if !strings.HasPrefix(dep, module) {
			continue
		}
		n++
		base := dep[strings.LastIndex(dep, "/")+1:]
		if strings.HasSuffix(base, "test") || strings.Contains(dep, "/testutil") {
			t.Errorf("production binaries depend on test helper %s", dep)
		}
	}
	if n < 10 {
		t.Fatalf("go list -deps named %d of the module's packages: %s", n, out)
	}
}
