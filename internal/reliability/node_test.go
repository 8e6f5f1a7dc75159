package reliability

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/internal/testutil"
	testcluster "github.com/pegaflow/pegad/internal/testutil/cluster"
)

// Fixed ports are safe inside a namespace: nothing else lives there.
const (
	peerPort    = 7000
	dataPort    = 7100
	metricsPort = 9464
	nics        = 2
	qpsPerPeer  = 2
)

// binaries are pegad and pegactl, built once per test binary run into a
// directory of their own (dir, removed by TestMain): never into the
// repository's bin/, which holds `make build`'s version-stamped binaries.
var binaries struct {
	once           sync.Once
	dir            string
	pegad, pegactl string
	err            error
}

// buildBinaries runs `go build` for pegad and pegactl from the repository
// root (this package is internal/reliability) into binaries.dir.
func buildBinaries(t testing.TB) string {
	t.Helper()
	binaries.once.Do(func() {
		root, err := filepath.Abs(filepath.Join("..", ".."))
		if err != nil {
			binaries.err = err
			return
		}
		if binaries.dir, err = os.MkdirTemp("", "pegad-reliability-bin-"); err != nil {
			binaries.err = err
			return
		}
		for _, b := range []string{"pegad", "pegactl"} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binaries.dir, b), "./cmd/"+b)
			cmd.Dir = root
			if out, err := cmd.CombinedOutput(); err != nil {
				binaries.err = fmt.Errorf("go build %s: %w: %s", b, err, out)
				return
			}
		}
		binaries.pegad = filepath.Join(binaries.dir, "pegad")
		binaries.pegactl = filepath.Join(binaries.dir, "pegactl")
	})
	if binaries.err != nil {
		t.Fatal(binaries.err)
	}
	return binaries.pegad
}

// nodeSpec is a daemon of a scenario.
type nodeSpec struct {
	name        string
	lockTimeout time.Duration // default 10s
	lifetime    time.Duration // lock-max-lifetime; 0: pegad's default
	pool        string        // default 192MiB
	extra       []string
	// ssdSize turns on the SSD tier: --ssd-path <dir>/ssd, --ssd-size.
	ssdSize string
	// ssdMount mounts a tmpfs of this size (mount's size= value) at the
	// SSD path first (a small disk that fills up; root only).
	ssdMount string
}

// node is one real pegad process and the clients that talk to it.
type node struct {
	spec    nodeSpec
	h       *netns // nil: loopback
	dir     string
	sock    string
	peer    string // peer gRPC host:port (what requesters dial)
	metrics string
	// dataAddrs are the tcp provider's device ports (one per NIC).
	dataAddrs []string
	args      []string
	logPath   string
	ssdDir    string // --ssd-path ("" without the SSD tier)

	mu      sync.Mutex // guards cmd, done, exitErr, starts
	cmd     *exec.Cmd
	done    chan struct{} // closed when the current process has exited
	exitErr error
	starts  int
	// stopping: a signal was sent to the current process; what it serves
	// now is not a verdict on the data (its socket may already be closed).
	stopping bool

	conn  *grpc.ClientConn
	local pegadv1.LocalServiceClient
	admin pegadv1.AdminServiceClient
	hc    *http.Client
}

// handedOut are the loopback ports freePorts gave this process: never
// given twice, so two daemons of a run cannot pick the same one.
var handedOut = struct {
	sync.Mutex // guards m
	m          map[int]bool
}{m: map[int]bool{}}

// freePorts returns the first of n consecutive loopback ports that are
// free at the time of the call (loopback mode; tcp device i uses port+i).
func freePorts(t testing.TB, n int) int {
	t.Helper()
	handedOut.Lock()
	defer handedOut.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		ok := !handedOut.m[p]
		for i := 1; i < n && ok; i++ {
			li, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+i)))
			ok = err == nil && !handedOut.m[p+i]
			if err == nil {
				ls = append(ls, li)
			}
		}
		for _, l := range ls {
			l.Close()
		}
		if ok {
			for i := range n {
				handedOut.m[p+i] = true
			}
			return p
		}
	}
	t.Fatal("no free loopback ports")
	return 0
}

func newNode(t testing.TB, spec nodeSpec, h *netns) *node {
	t.Helper()
	if spec.lockTimeout == 0 {
		spec.lockTimeout = 10 * time.Second
	}
	if spec.pool == "" {
		spec.pool = "192MiB"
	}
	dir := t.TempDir()
	n := &node{spec: spec, h: h, dir: dir, sock: filepath.Join(dir, "pegad.sock"), logPath: filepath.Join(dir, "pegad.log")}
	var data string
	if h != nil {
		n.peer = net.JoinHostPort(h.ip, strconv.Itoa(peerPort))
		n.metrics = net.JoinHostPort(h.ip, strconv.Itoa(metricsPort))
		data = net.JoinHostPort(h.ip, strconv.Itoa(dataPort))
	} else {
		n.peer = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePorts(t, 1)))
		n.metrics = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePorts(t, 1)))
		data = net.JoinHostPort("127.0.0.1", strconv.Itoa(freePorts(t, nics)))
	}
	host, port, _ := net.SplitHostPort(data)
	p0, _ := strconv.Atoi(port)
	for i := range nics {
		n.dataAddrs = append(n.dataAddrs, net.JoinHostPort(host, strconv.Itoa(p0+i)))
	}
	n.args = []string{"serve",
		"--node-id", spec.name, "--listen", n.peer, "--tcp-data-listen", data, "--metrics-listen", n.metrics,
		"--socket", n.sock, "--transport", "tcp", "--nics", strconv.Itoa(nics), "--qps-per-peer", strconv.Itoa(qpsPerPeer),
		"--pool-size", spec.pool, "--lock-timeout", spec.lockTimeout.String(), "--gc-interval", "100ms",
		"--shutdown-timeout", "5s", "--log-format", "json"}
	if spec.lifetime > 0 {
		n.args = append(n.args, "--lock-max-lifetime", spec.lifetime.String())
	}
	n.args = append(n.args, spec.extra...)
	if spec.ssdSize != "" {
		n.ssdDir = filepath.Join(dir, "ssd")
		n.args = append(n.args, "--ssd-path", n.ssdDir, "--ssd-size", spec.ssdSize)
		if spec.ssdMount != "" {
			mountTmpfs(t, n.ssdDir, "size="+spec.ssdMount, 0)
		}
	}
	conn, err := grpc.NewClient("passthrough:///pegad",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", n.sock)
		}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	n.conn = conn
	n.local = pegadv1.NewLocalServiceClient(conn)
	n.admin = pegadv1.NewAdminServiceClient(conn)
	n.hc = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext:       h.dial,
		DisableKeepAlives: true,
	}}
	t.Cleanup(func() {
		n.kill()
		conn.Close()
		if t.Failed() {
			if b, err := os.ReadFile(n.logPath); err == nil {
				lines := strings.Split(strings.TrimSpace(string(b)), "\n")
				t.Logf("----- %s log (last 40 lines) -----\n%s", spec.name, strings.Join(lines[max(0, len(lines)-40):], "\n"))
			}
		}
	})
	return n
}

// spawnReqs carries commands to the spawner goroutine.
var spawnReqs = make(chan spawnReq)

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// The spawner forks every daemon from one OS thread that stays locked for
// the life of the test binary. Pdeathsig fires when the forking *thread*
// exits, and the namespace dialers end their locked threads on purpose:
// a daemon forked from a thread that later became a dialer's would be
// killed with it.
func init() {
	go func() {
		runtime.LockOSThread()
		for r := range spawnReqs {
			r.done <- r.cmd.Start()
		}
	}()
}

func startCmd(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	spawnReqs <- spawnReq{cmd, done}
	return <-done
}

// start runs pegad and waits until its admin API answers.
func (n *node) start(t testing.TB) {
	t.Helper()
	if err := n.startErr(); err != nil {
		t.Fatal(err)
	}
}

func (n *node) startErr() error {
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	netns := "" // loopback
	if n.h != nil {
		netns = n.h.name
	}
	cmd := testcluster.Command(binaries.pegad, netns, n.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The daemons get no PEGAD_* variable of the test's environment: their
	// flags are their whole configuration.
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "PEGAD_") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	// A test binary that dies takes its daemons with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := startCmd(cmd); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	n.mu.Lock()
	n.cmd, n.done, n.exitErr, n.stopping = cmd, done, nil, false
	n.starts++
	n.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		n.mu.Lock()
		n.exitErr = err
		n.mu.Unlock()
		close(done)
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := n.admin.Stats(ctx, &pegadv1.StatsRequest{})
		cancel()
		if err == nil {
			// The local API is served before the metrics listener opens.
			if _, err = testutil.ScrapeMetrics(n.hc, n.metrics); err == nil {
				return nil
			}
		}
		select {
		case <-done:
			return fmt.Errorf("%s exited during start-up: %v", n.spec.name, n.exited())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after 30s: %w", n.spec.name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (n *node) setStopping() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.stopping = true
}

// serving reports whether the current process runs and was not signalled.
func (n *node) serving() bool {
	n.mu.Lock()
	stopping := n.stopping
	n.mu.Unlock()
	return !stopping && n.running()
}

func (n *node) exited() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.exitErr
}

// running reports whether the current process is alive.
func (n *node) running() bool {
	n.mu.Lock()
	done := n.done
	n.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

func (n *node) pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil || n.cmd.Process == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// kill sends SIGKILL and waits for the exit (no-op when not running).
func (n *node) kill() {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil || !n.running() {
		return
	}
	n.setStopping()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// stop sends SIGTERM: pegad must exit 0 within 20 s.
func (n *node) stop() error {
	n.mu.Lock()
	cmd, done := n.cmd, n.done
	n.mu.Unlock()
	if cmd == nil || !n.running() {
		return nil
	}
	n.setStopping()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return err
	}
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		n.kill()
		return fmt.Errorf("%s still running 20s after SIGTERM", n.spec.name)
	}
	if err := n.exited(); err != nil {
		return fmt.Errorf("%s exited after SIGTERM: %w, want exit 0", n.spec.name, err)
	}
	return nil
}

// pegactl runs the built pegactl against n's socket (what an operator types).
func (n *node) pegactl(args ...string) (string, error) {
	out, err := exec.Command(binaries.pegactl, append([]string{"--socket", n.sock, "--timeout", "10s"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("pegactl %s: %w: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return string(out), nil
}

// rssBytes is the process's resident set size (0 when unknown).
func (n *node) rssBytes() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", n.pid()))
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// scrape reads n's /metrics, retrying twice: a fresh namespace now and
// then resets the first connection to a just-started listener.
func (n *node) scrape() (map[string]float64, error) {
	var err error
	for try := range 3 {
		var m map[string]float64
		if m, err = testutil.ScrapeMetrics(n.hc, n.metrics); err == nil {
			return m, nil
		}
		time.Sleep(time.Duration(try+1) * 100 * time.Millisecond)
	}
	return nil, fmt.Errorf("%s /metrics: %w", n.spec.name, err)
}

// prefetch asks n to fetch blocks of namespace ns from peer.
func (n *node) prefetch(ctx context.Context, peer *node, ns string, hashes [][]byte, timeout time.Duration) (*pegadv1.PrefetchResponse, error) {
	req := &pegadv1.PrefetchRequest{Peer: peer.peer, Namespace: ns, Hashes: hashes}
	if timeout > 0 {
		req.Timeout = durationpb.New(timeout)
	}
	return n.local.Prefetch(ctx, req)
}

// fetchPhase is the phase of n's fetch from peer in flight ("" when none).
func (n *node) fetchPhase(ctx context.Context, peer *node) string {
	r, err := n.admin.ListSessions(ctx, &pegadv1.ListSessionsRequest{})
	if err != nil {
		return ""
	}
	for _, f := range r.GetFetches() {
		if f.GetPeer() == peer.peer {
			return f.GetPhase()
		}
	}
	return ""
}

// waitReading waits until n reads from peer (phase read), up to d.
func (n *node) waitReading(ctx context.Context, peer *node, d time.Duration) error {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if n.fetchPhase(ctx, peer) == "read" {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("%s: no read from %s in flight after %v", n.spec.name, peer.spec.name, d)
}
