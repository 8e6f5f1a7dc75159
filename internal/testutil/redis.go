package testutil

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a real redis-server started for one test on a free loopback
// port, with no persistence, in the test's temp dir. Stopped by the
// test's cleanup.
type Redis struct {
	tb   testing.TB
	bin  string
	dir  string
	port int

	mu  sync.Mutex // guards cmd
	cmd *exec.Cmd  // nil while killed
}

// StartRedis starts redis-server, or skips the test when the binary is
// not installed (.ci/run installs Debian's redis-server).
func StartRedis(tb testing.TB) *Redis {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Skip("redis-server not installed (apt-get install redis-server): skipping the test that needs a real Redis")
	}
	r := &Redis{tb: tb, bin: bin, dir: tb.TempDir()}
	var last error
	for range 5 { // a free port can be taken between probe and bind
		r.port = freePort(tb)
		if last = r.start(); last == nil {
			tb.Cleanup(r.Kill)
			return r
		}
	}
	tb.Fatalf("redis-server: %v", last)
	return nil
}

func freePort(tb testing.TB) int {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (r *Redis) start() error {
	cmd := exec.Command(r.bin,
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no",
		"--logfile", filepath.Join(r.dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			log, _ := os.ReadFile(filepath.Join(r.dir, "redis.log"))
			return fmt.Errorf("exited at start (%v): %s", err, lastLines(string(log), 3))
		default:
		}
		if ping(r.Addr()) == nil {
			r.mu.Lock()
			r.cmd = cmd
			r.mu.Unlock()
			go func() { <-exited }() // reaped by the goroutine above
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
	return fmt.Errorf("did not answer PING on %s within 10s", r.Addr())
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], " | ")
}

func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// Addr is host:port.
func (r *Redis) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(r.port)) }

// URL is the redis:// URL for --cluster-redis.
func (r *Redis) URL() string { return "redis://" + r.Addr() }

// Kill stops the server with SIGKILL (no shutdown save). Idempotent.
func (r *Redis) Kill() {
	r.mu.Lock()
	cmd := r.cmd
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	for ping(r.Addr()) == nil { // gone once it stops answering
		time.Sleep(10 * time.Millisecond)
	}
}

// Restart starts a fresh, empty server on the same port (after Kill).
func (r *Redis) Restart() {
	r.tb.Helper()
	r.Kill()
	var err error
	for range 50 { // the old socket may linger a moment
		if err = r.start(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.tb.Fatalf("redis-server restart on %s: %v", r.Addr(), err)
}

// Client is a go-redis client of the server, closed at cleanup, for tests
// that inspect keys.
func (r *Redis) Client(tb testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: r.Addr()})
	tb.Cleanup(func() { _ = c.Close() })
	return c
}
