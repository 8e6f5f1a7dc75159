package testutil

import (
	"bufio"
	"context"
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

	extra   []string // more redis-server arguments (cluster mode)
	busPort int      // cluster mode: the cluster bus port

	mu  sync.Mutex // guards cmd
	cmd *exec.Cmd  // nil while killed
}

// StartRedis starts redis-server, or skips the test when the binary is
// not installed (.ci/run installs Debian's redis-server).
func StartRedis(tb testing.TB) *Redis {
	tb.Helper()
	return startRedis(tb, false)
}

func startRedis(tb testing.TB, cluster bool) *Redis {
	tb.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Skip("redis-server not installed (apt-get install redis-server): skipping the test that needs a real Redis")
	}
	r := &Redis{tb: tb, bin: bin, dir: tb.TempDir()}
	var last error
	for range 5 { // a free port can be taken between probe and bind
		r.port = freePort(tb)
		if cluster {
			// The bus port must be free too (port+10000 may not exist).
			r.busPort = freePort(tb)
			r.extra = []string{"--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(r.dir, "nodes.conf"),
				"--cluster-port", strconv.Itoa(r.busPort)}
		}
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
	args := append([]string{
		"--port", strconv.Itoa(r.port), "--bind", "127.0.0.1", "--dir", r.dir,
		"--save", "", "--appendonly", "no", "--protected-mode", "no",
		"--logfile", filepath.Join(r.dir, "redis.log"),
	}, r.extra...)
	cmd := exec.Command(r.bin, args...)
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

// StartRedisCluster starts a Redis Cluster of n primaries (no replicas),
// the 16384 slots split evenly, and waits until it serves. Its
// --cluster-redis value is ClusterURL.
func StartRedisCluster(tb testing.TB, n int) []*Redis {
	tb.Helper()
	rs := make([]*Redis, n)
	for i := range rs {
		rs[i] = startRedis(tb, true)
	}
	ctx := context.Background()
	const slots = 16384
	for i, r := range rs {
		c := r.Client(tb)
		lo, hi := i*slots/n, (i+1)*slots/n-1
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err(); err != nil {
			tb.Fatalf("redis cluster: ADDSLOTSRANGE on %s: %v", r.Addr(), err)
		}
		if i > 0 {
			if err := rs[0].Client(tb).Do(ctx, "CLUSTER", "MEET", "127.0.0.1", r.port, r.busPort).Err(); err != nil {
				tb.Fatalf("redis cluster: MEET %s: %v", r.Addr(), err)
			}
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, r := range rs {
		for {
			info, err := r.Client(tb).ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				break
			}
			if time.Now().After(deadline) {
				tb.Fatalf("redis cluster never became ok on %s: %v %s", r.Addr(), err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return rs
}

// ClusterURL is the comma list of the cluster's redis:// URLs.
func ClusterURL(rs []*Redis) string {
	urls := make([]string, len(rs))
	for i, r := range rs {
		urls[i] = r.URL()
	}
	return strings.Join(urls, ",")
}
