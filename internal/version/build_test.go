package version

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestMakeHelpListsEveryTarget: `make help` lists every documented target,
// digits in the name included (e2e).
func TestMakeHelpListsEveryTarget(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("SKIP: make not found")
	}
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("make", "-s", "-C", "../..", "help").CombinedOutput()
	if err != nil {
		t.Fatalf("make help: %v\n%s", err, out)
	}
	listed := map[string]bool{}
	for _, l := range strings.Split(string(out), "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			listed[f[0]] = true
		}
	}
	targets := regexp.MustCompile(`(?m)^([A-Za-z0-9_.-]+):.*## `).FindAllStringSubmatch(string(mk), -1)
	if len(targets) == 0 {
		t.Fatal("no documented targets in the Makefile")
	}
	for _, m := range targets {
		if !listed[m[1]] {
			t.Errorf("make help does not list %q", m[1])
		}
	}
}

// TestE2EBuildsVersionStamped: the e2e scripts build bin/ the way
// `make build` does (with the version stamp), not with a bare go build
// that leaves "dev" in bin/pegad for the next person to run.
func TestE2EBuildsVersionStamped(t *testing.T) {
	lib, err := os.ReadFile("../../scripts/lib.sh")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(lib), "\n") {
		if strings.Contains(l, "go build") && strings.Contains(l, "bin/") {
			t.Errorf("scripts/lib.sh builds bin/ without the version stamp: %s", strings.TrimSpace(l))
		}
	}
	if !strings.Contains(string(lib), "make -s build") {
		t.Error("scripts/lib.sh does not build bin/ with make build")
	}
}
