package cluster

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/daemon/cli"
	"github.com/pegaflow/pegad/internal/testutil"
)

// envRunPegad makes a test binary run pegad instead of its tests: a
// process node is the test binary itself, re-executed, so there is nothing
// to build and it runs the code under test (race detector included).
const envRunPegad = "PEGAD_TEST_CLUSTER_RUN_PEGAD"

// RunPegadIfChild runs pegad and exits when this test binary was started
// by StartProcess. A package that uses StartProcess calls it first thing
// in TestMain (or an init function).
func RunPegadIfChild() {
	if os.Getenv(envRunPegad) == "1" {
		os.Exit(cli.Main()) // os.Args[1:] are pegad's: serve --config ...
	}
}

// Command is the one way a test runs pegad as a process: bin with args, in
// the network namespace netns (`ip netns exec netns bin args...`, the same
// pid once ip has entered it) when netns is not "". StartProcess uses it;
// so does a suite that keeps a process's life itself (the reliability
// suite restarts its daemons in place).
func Command(bin, netns string, args ...string) *exec.Cmd {
	if netns != "" {
		return exec.Command("ip", append([]string{"netns", "exec", netns, bin}, args...)...)
	}
	return exec.Command(bin, args...)
}

// process is a process node's child.
type process struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when Wait returned
	err    error         // Wait's error, once exited
}

// StartProcess starts a node as a child process of pegad (this test binary
// re-executed; see RunPegadIfChild) with the config opts give, written to a
// YAML file it is started with. It waits for "pegad ready" and connects. It
// is stopped with SIGTERM at cleanup, or killed if it does not stop. In a
// namespace (InNetns) its TCP addresses are the namespace's: the local
// clients work (the socket is a file), Scrape and Peer need a route there.
func StartProcess(t testing.TB, opts ...Option) *Node {
	t.Helper()
	s, c := configFor(t, opts)
	c.LogFormat = "json"
	if s.verbose {
		c.LogLevel = "debug"
	}
	file := filepath.Join(t.TempDir(), "pegad.yaml")
	var buf bytes.Buffer
	src := map[string]config.Source{}
	for _, k := range config.Keys() {
		src[k] = config.SourceDefault
	}
	if err := (config.Effective{Config: c, Sources: src}).WriteYAML(&buf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, buf.Bytes(), 0o600); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	logs := &testutil.LogBuffer{}
	cmd := Command(self, s.netns, append([]string{"serve", "--config", file}, s.args...)...)
	cmd.Env = append(append(os.Environ(), envRunPegad+"=1"), s.env...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, exited: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.exited) }()
	n := &Node{Name: s.name, Config: c, Logs: logs, proc: p, socket: c.Socket}
	t.Cleanup(func() {
		if err := n.Stop(); err != nil {
			t.Errorf("stop %s: %v\n%s", n.Name, err, logs)
		}
	})
	if err := n.waitReady(30 * time.Second); err != nil {
		t.Fatalf("start %s: %v\n%s", s.name, err, logs)
	}
	n.connect(t)
	return n
}

// waitReady waits for the "pegad ready" log line and takes the bound
// addresses from it.
func (n *Node) waitReady(d time.Duration) error {
	end := time.Now().Add(d)
	for {
		if ready, ok := readyLine(n.Logs.Bytes()); ok {
			n.peerAddr, n.metricsAddr, n.incarnation = ready.Listen, ready.Metrics, ready.Incarnation
			return nil
		}
		select {
		case <-n.proc.exited:
			return fmt.Errorf("exited during start-up: %v", n.proc.err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(end) {
			return fmt.Errorf("not ready within %v", d)
		}
	}
}

type readyFields struct {
	Message     string `json:"message"`
	Listen      string `json:"listen"`
	Metrics     string `json:"metrics"`
	Incarnation string `json:"incarnation"`
}

func readyLine(logs []byte) (readyFields, bool) {
	sc := bufio.NewScanner(bytes.NewReader(logs))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var f readyFields
		if json.Unmarshal(sc.Bytes(), &f) == nil && f.Message == "pegad ready" {
			return f, true
		}
	}
	return readyFields{}, false
}

// Kill sends SIGKILL to a process node and waits for it to die: no
// shutdown runs, as when a node crashes. Stop after Kill returns nil.
func (n *Node) Kill(t testing.TB) {
	t.Helper()
	if n.proc == nil {
		t.Fatalf("%s: Kill needs a process node (StartProcess)", n.Name)
	}
	_ = n.proc.cmd.Process.Signal(syscall.SIGKILL)
	<-n.proc.exited
}

// Signal sends sig to a process node.
func (n *Node) Signal(t testing.TB, sig os.Signal) {
	t.Helper()
	if n.proc == nil {
		t.Fatalf("%s: Signal needs a process node (StartProcess)", n.Name)
	}
	if err := n.proc.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: signal %v: %v", n.Name, sig, err)
	}
}

// WaitExit waits up to d for a process node's process to end: as Exited,
// whether it did and how (nil: exit 0).
func (n *Node) WaitExit(t testing.TB, d time.Duration) (bool, error) {
	t.Helper()
	if n.proc == nil {
		t.Fatalf("%s: WaitExit needs a process node (StartProcess)", n.Name)
	}
	select {
	case <-n.proc.exited:
		return true, n.proc.err
	case <-time.After(d):
		return false, nil
	}
}

// Pid is a process node's pid (0 in process).
func (n *Node) Pid() int {
	if n.proc == nil {
		return 0
	}
	return n.proc.cmd.Process.Pid
}

// Exited reports whether a process node's process has ended, and how (an
// in-process node reports false).
func (n *Node) Exited() (bool, error) {
	if n.proc == nil {
		return false, nil
	}
	select {
	case <-n.proc.exited:
		return true, n.proc.err
	default:
		return false, nil
	}
}

// stop sends SIGTERM and waits up to the shutdown timeout plus 10 s, then
// kills. A process that was killed (Kill) or exited by itself stops clean.
func (p *process) stop() error {
	select {
	case <-p.exited:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		var ee *exec.ExitError
		if errors.As(p.err, &ee) {
			return fmt.Errorf("exit after SIGTERM: %w", p.err)
		}
		return p.err
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.exited
		return errors.New("did not stop within 30s of SIGTERM; killed")
	}
}
