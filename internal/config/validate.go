package config

import (
	"fmt"
	"net"
	"net/url"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pegaflow/pegad/internal/evict"
	"github.com/pegaflow/pegad/internal/peertls"
)

// Validate checks every value; errors name the key and are ErrInvalid.
func (c *Config) Validate() error {
	probs := c.problems()
	if len(probs) == 0 {
		return nil
	}
	msgs := make([]string, len(probs))
	for i, p := range probs {
		msgs[i] = "invalid " + p.Key + ": " + p.Reason
	}
	return Invalid(fmt.Errorf("config: %s", strings.Join(msgs, "; ")))
}

// problems lists every invalid value, each with its key.
func (c *Config) problems() []Problem {
	var probs []Problem
	bad := func(key, format string, a ...any) {
		probs = append(probs, Problem{Key: key, Reason: fmt.Sprintf(format, a...)})
	}
	c.validateEndpoints(bad)
	if c.PoolSize < MinPoolSize {
		bad("pool-size", "%s is below the minimum %s", c.PoolSize, MinPoolSize)
	}
	c.validateSSD(bad)
	c.validateQuotas(bad)
	switch c.PoolHugePages {
	case "none", "thp", "2M", "1G":
	default:
		bad("pool-hugepages", "%q is not one of none, thp, 2M, 1G", c.PoolHugePages)
	}
	if _, err := evict.ParseKind(c.Eviction); err != nil {
		bad("eviction", "%q is not one of adaptive, prefix, lru", c.Eviction)
	}
	c.validateTransport(bad)
	c.validateTimeouts(bad)
	probs = append(probs, c.securityProblems()...)
	return probs
}

// validateEndpoints checks the node's identity and the addresses it listens
// on or publishes to.
func (c *Config) validateEndpoints(bad badFunc) {
	if strings.TrimSpace(c.NodeID) == "" {
		bad("node-id", "must not be empty")
	}
	if err := checkHostPort(c.Listen, true); err != nil {
		bad("listen", "%v", err)
	}
	if c.Advertise != "" {
		if err := checkHostPort(c.Advertise, false); err != nil {
			bad("advertise", "%v", err)
		}
	}
	if strings.TrimSpace(c.Socket) == "" {
		bad("socket", "must not be empty")
	}
	if c.MetricsListen != "" {
		if err := checkHostPort(c.MetricsListen, true); err != nil {
			bad("metrics-listen", "%v", err)
		}
	}
	if c.DebugListen != "" {
		if err := checkLoopbackHostPort(c.DebugListen); err != nil {
			bad("debug-listen", "%v", err)
		}
	}
	for _, e := range [...]struct{ key, ep string }{
		{"kv-events-endpoint", c.KVEventsEndpoint}, {"kv-events-replay-endpoint", c.KVEventsReplayEndpoint},
	} {
		if e.ep == "" {
			continue
		}
		if err := checkZMQEndpoint(e.ep); err != nil {
			bad(e.key, "%v", err)
		}
	}
	if c.KVEventsReplayEndpoint != "" && c.KVEventsEndpoint == "" {
		bad("kv-events-replay-endpoint", "needs kv-events-endpoint")
	}
}

// validateTransport checks the data transport's keys: NICs, QPs, RoCE
// addressing and the tcp provider's.
func (c *Config) validateTransport(bad badFunc) {
	switch c.Transport {
	case TransportAuto, TransportVerbs, TransportTCP:
	default:
		bad("transport", "%q is not one of auto, verbs, tcp", c.Transport)
	}
	if _, _, err := c.NICSpec(); err != nil {
		bad("nics", "%v", err)
	}
	if _, err := c.NICNUMANodes(); err != nil {
		bad("nic-numa", "%v", err)
	}
	if c.QPsPerPeer < 1 || c.QPsPerPeer > MaxQPsPerPeer {
		bad("qps-per-peer", "%d is outside 1..%d", c.QPsPerPeer, MaxQPsPerPeer)
	}
	if c.GIDIndex < -1 || c.GIDIndex > 255 {
		bad("gid-index", "%d is outside -1..255", c.GIDIndex)
	}
	if c.TrafficClass < 0 || c.TrafficClass > 255 {
		bad("traffic-class", "%d is outside 0..255", c.TrafficClass)
	}
	if c.ServiceLevel < 0 || c.ServiceLevel > 15 {
		bad("service-level", "%d is outside 0..15", c.ServiceLevel)
	}
	if c.PKeyIndex < 0 || c.PKeyIndex > 0xffff {
		bad("pkey-index", "%d is outside 0..65535", c.PKeyIndex)
	}
	// 0 is "wait forever" in the IB spec: a dead peer would never fail.
	if c.QPTimeout != -1 && (c.QPTimeout < 1 || c.QPTimeout > 31) {
		bad("qp-timeout", "%d is outside 1..31 (-1: transport default)", c.QPTimeout)
	}
	if c.QPRetryCount < 0 || c.QPRetryCount > 7 {
		bad("qp-retry-count", "%d is outside 0..7", c.QPRetryCount)
	}
	if c.CQBusyPoll < 0 || c.CQBusyPoll > 10*time.Millisecond {
		bad("cq-busy-poll", "%s is outside 0..10ms", c.CQBusyPoll)
	}
	if c.TCPDataListen != "" {
		if err := checkHostPort(c.TCPDataListen, true); err != nil {
			bad("tcp-data-listen", "%v", err)
		}
	}
	if c.TCPQPNStart < 1 || c.TCPQPNStart > MaxQPN/2 {
		bad("tcp-qpn-start", "%#x is outside 0x1..%#x", c.TCPQPNStart, MaxQPN/2)
	}
}

// validateTimeouts checks the lock, GC and shutdown times, the cluster
// index and logging.
func (c *Config) validateTimeouts(bad badFunc) {
	if c.RDMAIdleTimeout <= 0 {
		bad("rdma-idle-timeout", "%s must be positive", c.RDMAIdleTimeout)
	}
	if c.LockTimeout <= 0 {
		bad("lock-timeout", "%s must be positive", c.LockTimeout)
	}
	if c.LockMaxLifetime < 0 {
		bad("lock-max-lifetime", "%s must not be negative", c.LockMaxLifetime)
	} else if c.LockMaxLifetime > 0 && c.LockMaxLifetime < c.LockTimeout {
		bad("lock-max-lifetime", "%s is shorter than lock-timeout %s", c.LockMaxLifetime, c.LockTimeout)
	}
	if c.GCInterval <= 0 {
		bad("gc-interval", "%s must be positive", c.GCInterval)
	}
	if c.ShutdownTimeout <= 0 {
		bad("shutdown-timeout", "%s must be positive", c.ShutdownTimeout)
	}
	if err := checkRedisURLs(c.ClusterRedis); err != nil {
		bad("cluster-redis", "%v", err)
	}
	if c.ClusterTTL < 100*time.Millisecond {
		bad("cluster-ttl", "%s is shorter than 100ms", c.ClusterTTL)
	}
	switch strings.ToLower(c.LogLevel) {
	case "trace", "debug", "info", "warn", "warning", "error":
	default:
		bad("log-level", "%q is not one of trace, debug, info, warn, error", c.LogLevel)
	}
	switch c.LogFormat {
	case "json", "console", "auto":
	default:
		bad("log-format", "%q is not one of json, console, auto", c.LogFormat)
	}
}

// badFunc records one problem with a key.
type badFunc = func(key, format string, a ...any)

// securityProblems checks the peer-protection keys.
func (c *Config) securityProblems() []Problem {
	var probs []Problem
	bad := func(key, format string, a ...any) {
		probs = append(probs, Problem{Key: key, Reason: fmt.Sprintf(format, a...)})
	}
	// peertls's own checks, so that what passes here is what the daemon's
	// peertls.New accepts (short of reading the files).
	if err := c.PeerTLSFiles().Check(); err != nil {
		bad("peer-tls-cert", "%v", err)
	}
	if strings.TrimSpace(c.PeerAllow) != "" {
		if !c.PeerTLS() {
			bad("peer-allow", "needs peer-tls-cert, peer-tls-key and peer-tls-ca (identities come from certificates)")
		}
		if _, err := peertls.ParseAllowList(c.PeerAllow); err != nil {
			bad("peer-allow", "%v", err)
		}
	}
	if c.MaxSessionsPerPeer < 0 {
		bad("max-sessions-per-peer", "%d must not be negative", c.MaxSessionsPerPeer)
	}
	if c.MaxPinnedBytes > c.PoolSize {
		bad("max-pinned-bytes", "%s is more than pool-size %s", c.MaxPinnedBytes, c.PoolSize)
	}
	if c.MaxPinnedBytesPerPeer > c.PoolSize {
		bad("max-pinned-bytes-per-peer", "%s is more than pool-size %s", c.MaxPinnedBytesPerPeer, c.PoolSize)
	}
	return probs
}

// checkHostPort accepts host:port with a numeric port; port 0 (an ephemeral
// port) only when allowZero.
func checkHostPort(s string, allowZero bool) error {
	_, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not host:port", s)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 || (p == 0 && !allowZero) {
		return fmt.Errorf("%q has an invalid port", s)
	}
	return nil
}

// checkLoopbackHostPort is checkHostPort for an address that must stay on
// this host: an IP loopback address or "localhost".
func checkLoopbackHostPort(s string) error {
	if err := checkHostPort(s, true); err != nil {
		return err
	}
	host, _, _ := net.SplitHostPort(s)
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("%q is not a loopback address (127.0.0.0/8, ::1 or localhost)", s)
	}
	return nil
}

// UnknownEnv lists the PEGAD_* variables of environ ("K=V" pairs) that are
// not settings (a typo such as PEGAD_POOLSIZE would otherwise be ignored
// silently). PEGAD_CONFIG and PEGAD_TEST_* (test hooks) are not reported.
// The daemon logs them as warnings; they are not errors, so that unrelated
// tooling sharing the prefix cannot stop a node.
func UnknownEnv(environ []string) []string {
	known := map[string]bool{EnvPrefix + "_CONFIG": true}
	for _, k := range Keys() {
		known[EnvPrefix+"_"+strings.ToUpper(strings.ReplaceAll(k, "-", "_"))] = true
	}
	var out []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, EnvPrefix+"_") && !known[k] && !strings.HasPrefix(k, EnvPrefix+"_TEST_") {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// checkRedisURLs checks the form of --cluster-redis (the Redis client
// parses it fully at start): each comma-separated item a redis:// or
// rediss:// URL with a host.
func checkRedisURLs(s string) error {
	if s == "" {
		return nil
	}
	for _, raw := range strings.Split(s, ",") {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil {
			return fmt.Errorf("%q: %v", raw, err)
		}
		if u.Scheme != "redis" && u.Scheme != "rediss" {
			return fmt.Errorf("%q: want redis://[user:password@]host:port or rediss://", raw)
		}
		if u.Host == "" {
			return fmt.Errorf("%q: no host", raw)
		}
	}
	return nil
}

// SSDPaths is --ssd-path split into its directories.
func (c *Config) SSDPaths() []string {
	if strings.TrimSpace(c.SSDPath) == "" {
		return nil
	}
	parts := strings.Split(c.SSDPath, ",")
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

func (c *Config) validateSSD(bad func(key, format string, args ...any)) {
	paths := c.SSDPaths()
	if paths == nil {
		return
	}
	seen := map[string]bool{}
	for _, p := range paths {
		switch {
		case p == "":
			bad("ssd-path", "empty entry in %q", c.SSDPath)
		case !filepath.IsAbs(p):
			bad("ssd-path", "%q is not an absolute path", p)
		case seen[filepath.Clean(p)]:
			bad("ssd-path", "%q is listed twice", p)
		}
		seen[filepath.Clean(p)] = true
	}
	if c.SSDSize < MinSSDSize {
		bad("ssd-size", "%s is below the minimum %s (required with ssd-path)", c.SSDSize, MinSSDSize)
	}
}
