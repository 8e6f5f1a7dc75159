package integration

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/testutil"
)

const twoNodesDoc = "../../docs/two-nodes.md"

// docStep is one ```sh block of a doc page, its commands with their
// continuation lines joined, and the ```text block after it (the output
// the page shows for it), if any.
type docStep struct {
	cmds []string
	want []string
}

// docSteps reads the ```sh blocks of a markdown page, in order.
func docSteps(t *testing.T, path string) []docStep {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var steps []docStep
	var block []string
	fence := ""
	for _, line := range strings.Split(string(b), "\n") {
		switch {
		case fence == "" && strings.HasPrefix(line, "```"):
			fence, block = strings.TrimPrefix(line, "```"), nil
		case fence != "" && line == "```":
			switch {
			case fence == "sh":
				steps = append(steps, docStep{cmds: joinContinued(block)})
			case fence == "text" && len(steps) > 0 && steps[len(steps)-1].want == nil:
				steps[len(steps)-1].want = block
			}
			fence = ""
		case fence != "":
			block = append(block, line)
		}
	}
	return steps
}

// joinContinued joins lines ending in a backslash with the next, and drops
// blank and comment lines.
func joinContinued(lines []string) []string {
	var out []string
	cur := ""
	for _, l := range lines {
		if c, ok := strings.CutSuffix(l, "\\"); ok {
			cur += strings.TrimSpace(c) + " "
			continue
		}
		cur += strings.TrimSpace(l)
		if cur != "" && !strings.HasPrefix(cur, "#") {
			out = append(out, cur)
		}
		cur = ""
	}
	return out
}

// volatile is what a run's output changes from the page's: durations and
// session ids.
var volatile = regexp.MustCompile(`\b\d+(\.\d+)?(ns|us|µs|ms|s|m)\b|\b[0-9a-f]{32}\b`)

func normalize(s string) string {
	return strings.Join(strings.Fields(volatile.ReplaceAllString(s, "*")), " ")
}

// TestTwoNodesDoc (issue 33 item 10): docs/two-nodes.md's commands, run in
// order exactly as the page gives them, in a directory holding what `make
// build` makes, print what the page shows. Only two things differ from a
// reader's run: each documented port is swapped for a free one (the test
// runs beside others), and `make build` is done here with go build (the
// same two binaries, into bin/). A `bin/pegad serve` runs in the
// background, as in its own terminal, until the page is done; then it
// gets the page's Ctrl-C (SIGINT) and must exit 0.
func TestTwoNodesDoc(t *testing.T) {
	if testing.Short() {
		t.Skip("builds pegad and pegactl")
	}
	steps := docSteps(t, twoNodesDoc)
	dir, err := os.MkdirTemp("", "two-nodes") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ports := map[string]string{}
	for _, p := range []string{"50055", "50057", "50065", "50067", "9464", "9465"} {
		ports[p] = fmt.Sprint(freeLoopbackPort(t))
	}
	swap := func(s string) string {
		for doc, free := range ports {
			s = regexp.MustCompile(`:`+doc+`\b`).ReplaceAllString(s, ":"+free)
		}
		return s
	}
	page, _ := os.ReadFile(twoNodesDoc)
	for p := range ports {
		if !strings.Contains(string(page), "127.0.0.1:"+p) {
			t.Fatalf("docs/two-nodes.md no longer uses port %s: update the test's port list", p)
		}
	}

	var daemons []*docDaemon
	t.Cleanup(func() {
		for _, d := range daemons {
			d.stop(t)
		}
	})
	built := false
	for _, st := range steps {
		var out bytes.Buffer
		for _, c := range st.cmds {
			switch {
			case c == "make build":
				buildBinaries(t, dir)
				built = true
			case strings.HasPrefix(c, "bin/pegad serve "):
				daemons = append(daemons, startDocDaemon(t, dir, swap(c)))
			default:
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", swap(c))
				cmd.Dir = dir
				var stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &out, &stderr
				err := cmd.Run()
				cancel()
				if err != nil {
					t.Fatalf("docs/two-nodes.md: %s: %v\nstdout %s\nstderr %s\nlogs:\n%s", c, err, out.String(), stderr.String(), logsOf(daemons))
				}
			}
		}
		if st.want == nil {
			continue
		}
		got := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
		if len(got) != len(st.want) {
			t.Fatalf("docs/two-nodes.md: %q printed %d lines, the page shows %d:\n%s", st.cmds, len(got), len(st.want), out.String())
		}
		for i := range got {
			if normalize(got[i]) != normalize(swap(st.want[i])) {
				t.Errorf("docs/two-nodes.md: %q line %d:\n got  %q\n page %q", st.cmds, i+1, got[i], st.want[i])
			}
		}
	}
	if !built || len(daemons) != 2 {
		t.Fatalf("the page builds %v and starts %d pegads; the test expects make build and two", built, len(daemons))
	}
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// buildBinaries does what `make build` does for this page: bin/pegad and
// bin/pegactl under dir.
func buildBinaries(t *testing.T, dir string) {
	t.Helper()
	for _, b := range []string{"pegad", "pegactl"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, "bin", b), "./cmd/"+b)
		cmd.Dir = "../.."
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", b, err, out)
		}
	}
}

// docDaemon is a pegad the page starts in a terminal of its own.
type docDaemon struct {
	cmd  *exec.Cmd
	logs *testutil.LogBuffer
	done chan error
}

// startDocDaemon runs line (a `bin/pegad serve ...`) in dir and waits
// until its --socket answers pegactl.
func startDocDaemon(t *testing.T, dir, line string) *docDaemon {
	t.Helper()
	args := strings.Fields(line)
	d := &docDaemon{cmd: exec.Command(filepath.Join(dir, args[0]), args[1:]...), logs: &testutil.LogBuffer{}, done: make(chan error, 1)}
	d.cmd.Dir = dir
	d.cmd.Stdout, d.cmd.Stderr = d.logs, d.logs
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { d.done <- d.cmd.Wait() }()
	socket := ""
	for i, a := range args {
		if a == "--socket" && i+1 < len(args) {
			socket = args[i+1]
		}
	}
	eventually(t, "pegad to serve: "+line, 30*time.Second, func() error {
		select {
		case err := <-d.done:
			d.done <- err
			t.Fatalf("%s exited: %v\n%s", line, err, d.logs)
		default:
		}
		_, stderr, code := runPegactl(filepath.Join(dir, socket), "stats")
		if code != 0 {
			return fmt.Errorf("pegactl stats: %s", stderr)
		}
		return nil
	})
	return d
}

// stop is the page's Ctrl-C: pegad must drain and exit 0.
func (d *docDaemon) stop(t *testing.T) {
	_ = d.cmd.Process.Signal(syscall.SIGINT)
	select {
	case err := <-d.done:
		if err != nil {
			t.Errorf("pegad after Ctrl-C: %v\n%s", err, d.logs)
		} else if !strings.Contains(d.logs.String(), "Shutdown complete") {
			t.Errorf("pegad exited 0 without \"Shutdown complete\":\n%s", d.logs)
		}
	case <-time.After(30 * time.Second):
		_ = d.cmd.Process.Kill()
		t.Errorf("pegad did not stop within 30 s of Ctrl-C:\n%s", d.logs)
	}
}

func logsOf(ds []*docDaemon) string {
	var b strings.Builder
	for _, d := range ds {
		b.WriteString(d.logs.String())
	}
	return b.String()
}
