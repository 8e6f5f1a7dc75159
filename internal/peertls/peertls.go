// Package peertls owns the peer port's mutual TLS: it loads the node
// certificate, its key and the cluster CA from files, builds the server and
// client *tls.Config (and gRPC credentials) that always use the newest good
// copy of those files, reloads them on request (SIGHUP in the daemon) and
// tells who a verified peer is (its certificate names) and whether the
// allow-list admits it.
//
// A reload that fails keeps the files already in use: a bad rotation never
// takes a node off the network. Connections already established keep the
// certificate they were set up with (TLS does not renegotiate), so a reload
// drops no session and no queue pair.
//
// It must never decide what an identity may do beyond the allow-list
// (limits and session ownership are the holder's), and never open
// listeners or connections itself.
package peertls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc/credentials"
)

// ExpiryWarning is how long before its NotAfter the node certificate is
// warned about.
const ExpiryWarning = 7 * 24 * time.Hour

// Errors a load or reload wraps.
var (
	// ErrIncomplete: some but not all of cert, key and CA are set.
	ErrIncomplete = errors.New("peer TLS needs all three of --peer-tls-cert, --peer-tls-key and --peer-tls-ca, or none")
	// ErrBadFiles: a file is unreadable, not PEM, the key does not match,
	// the CA holds no certificate, or the certificate does not chain to the
	// CA or is outside its validity period.
	ErrBadFiles = errors.New("bad peer TLS files")
)

// Files names the three PEM files.
type Files struct {
	Cert, Key, CA string
}

// Enabled reports whether TLS is asked for; Check tells a partial set.
func (f Files) Enabled() bool { return f.Cert != "" || f.Key != "" || f.CA != "" }

// Check is nil when all three files are named, or none is.
func (f Files) Check() error {
	if f.Enabled() && (f.Cert == "" || f.Key == "" || f.CA == "") {
		return ErrIncomplete
	}
	return nil
}

// material is one consistent load of the three files.
type material struct {
	cert  *tls.Certificate
	leaf  *x509.Certificate
	roots *x509.CertPool
}

// Source serves the newest good material to every handshake. Safe for
// concurrent use.
type Source struct {
	files Files
	allow AllowList
	log   zerolog.Logger
	m     Recorder
	now   func() time.Time

	onReload func() // Options.OnReload; nil: none

	cur atomic.Pointer[material]

	reloadMu sync.Mutex // serializes Reload (file reads and the swap)

	// failLog is log, sampled: a port scanner must not flood the log with
	// one line per failed handshake.
	failLog zerolog.Logger
}

// Options configure New.
type Options struct {
	Files   Files
	Allow   AllowList // empty: every certificate the CA signed
	Log     zerolog.Logger
	Metrics Recorder         // nil: nothing counted
	Now     func() time.Time // nil: time.Now
	// OnReload, when set, runs after each successful Reload (the daemon
	// forgets which peers refused its certificate: it may have changed).
	OnReload func()
}

// New loads the files; any problem is an error (the daemon does not start).
func New(o Options) (*Source, error) {
	if err := o.Files.Check(); err != nil {
		return nil, err
	}
	if !o.Files.Enabled() {
		return nil, fmt.Errorf("%w: no files named", ErrIncomplete)
	}
	if o.Metrics == nil {
		o.Metrics = nopRecorder{}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	s := &Source{files: o.Files, allow: o.Allow, log: o.Log, m: o.Metrics, now: o.Now, onReload: o.OnReload}
	s.failLog = o.Log.Sample(&zerolog.BurstSampler{Burst: 10, Period: time.Second})
	m, err := load(o.Files, o.Now())
	if err != nil {
		return nil, err
	}
	s.install(m)
	return s, nil
}

// load reads and checks the three files.
func load(f Files, now time.Time) (*material, error) {
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, fmt.Errorf("%w: certificate %s / key %s: %v", ErrBadFiles, f.Cert, f.Key, err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("%w: certificate %s: %v", ErrBadFiles, f.Cert, err)
	}
	cert.Leaf = leaf
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, fmt.Errorf("%w: CA %s: %v", ErrBadFiles, f.CA, err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%w: CA %s: no PEM certificate in it", ErrBadFiles, f.CA)
	}
	// The node's own certificate must chain to the CA it trusts: peers
	// trust the same CA, so anything else would be refused by all of them.
	if _, err := verify(&cert, roots, now, x509.ExtKeyUsageAny); err != nil {
		return nil, fmt.Errorf("%w: certificate %s does not verify against CA %s: %v", ErrBadFiles, f.Cert, f.CA, err)
	}
	return &material{cert: &cert, leaf: leaf, roots: roots}, nil
}

// verify checks the chain of c (leaf first) against roots.
func verify(c *tls.Certificate, roots *x509.CertPool, now time.Time, usage x509.ExtKeyUsage) ([][]*x509.Certificate, error) {
	if len(c.Certificate) == 0 {
		return nil, errors.New("no certificate")
	}
	leaf := c.Leaf
	if leaf == nil {
		var err error
		if leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, err
		}
	}
	inter := x509.NewCertPool()
	for _, der := range c.Certificate[1:] {
		ic, err := x509.ParseCertificate(der)
		if err != nil {
			return nil, err
		}
		inter.AddCert(ic)
	}
	return leaf.Verify(x509.VerifyOptions{
		Roots: roots, Intermediates: inter, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{usage},
	})
}

func (s *Source) install(m *material) {
	s.cur.Store(m)
	s.m.CertInstalled(m.leaf.NotAfter)
}

// Reload reads the files again. On error the material in use stays and the
// error says why; established connections are never touched.
func (s *Source) Reload() error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	m, err := load(s.files, s.now())
	if err != nil {
		s.m.Reloaded(false)
		s.log.Error().Err(err).Time("not_after", s.NotAfter()).
			Msg("Peer TLS reload failed: keeping the certificate and CA in use")
		return err
	}
	s.install(m)
	s.m.Reloaded(true)
	s.log.Info().Str("identity", Identity(m.leaf)).Time("not_after", m.leaf.NotAfter).
		Str("serial", m.leaf.SerialNumber.Text(16)).Msg("Peer TLS files reloaded")
	s.WarnExpiry()
	if s.onReload != nil {
		s.onReload()
	}
	return nil
}

// NotAfter is the expiry of the certificate in use.
func (s *Source) NotAfter() time.Time { return s.cur.Load().leaf.NotAfter }

// Identity is the identity of this node's certificate (see Identity).
func (s *Source) Identity() string { return Identity(s.cur.Load().leaf) }

// Names are the identities this node's certificate proves (see Names).
func (s *Source) Names() []string { return Names(s.cur.Load().leaf) }

// WarnExpiry logs a warning when the certificate in use expires within
// ExpiryWarning; it reports whether it warned.
func (s *Source) WarnExpiry() bool {
	left := s.NotAfter().Sub(s.now())
	if left > ExpiryWarning {
		return false
	}
	s.log.Warn().Time("not_after", s.NotAfter()).Dur("left", left).Str("cert", s.files.Cert).
		Msg("Peer TLS certificate expires soon: issue a new one and send SIGHUP")
	return true
}

// Run reloads on every value of reload and re-checks the expiry every
// check interval, until ctx is done. The daemon runs it in a goroutine it
// owns.
func (s *Source) Run(ctx context.Context, reload <-chan os.Signal, check time.Duration) {
	t := time.NewTicker(check)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-reload:
			_ = s.Reload() // logged and counted by Reload
		case <-t.C:
			s.WarnExpiry()
		}
	}
}

// ServerConfig requires a client certificate signed by the CA; each
// handshake gets the material current at that moment.
func (s *Source) ServerConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			m := s.cur.Load()
			return &tls.Config{
				MinVersion:   tls.VersionTLS13,
				Certificates: []tls.Certificate{*m.cert},
				ClientAuth:   tls.RequireAndVerifyClientCert,
				ClientCAs:    m.roots,
				NextProtos:   []string{"h2"}, // gRPC requires ALPN h2
			}, nil
		},
	}
}

// ClientConfig presents the node certificate and verifies the holder's
// against the CA (and the allow-list, when set). Peers are dialed by
// address, often an IP a node certificate does not name, so the check is
// "signed by the cluster CA" rather than a host name match: the CA is the
// trust boundary (docs/security.md).
func (s *Source) ClientConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return s.cur.Load().cert, nil
		},
		// The standard verification runs in VerifyConnection instead, with
		// the roots current at this handshake (they change on reload).
		InsecureSkipVerify: true,
		VerifyConnection:   s.verifyServer,
	}
}

func (s *Source) verifyServer(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("peer presented no certificate")
	}
	c := &tls.Certificate{Leaf: cs.PeerCertificates[0]}
	for _, pc := range cs.PeerCertificates {
		c.Certificate = append(c.Certificate, pc.Raw)
	}
	if _, err := verify(c, s.cur.Load().roots, s.now(), x509.ExtKeyUsageServerAuth); err != nil {
		return fmt.Errorf("holder certificate: %w", err)
	}
	if names := Names(cs.PeerCertificates[0]); !s.allow.Allows(names) {
		return fmt.Errorf("holder certificate %q is %w", Identity(cs.PeerCertificates[0]), ErrNotAllowed)
	}
	return nil
}

// ServerCredentials are the peer server's gRPC credentials; a failed
// handshake (plaintext, no certificate, another CA) is counted and logged
// (sampled) with the remote address.
func (s *Source) ServerCredentials() credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: credentials.NewTLS(s.ServerConfig()), s: s}
}

// ClientCredentials are the requester's gRPC credentials for peers. A
// handshake refused for a certificate fails with an error wrapping
// ErrRefused.
func (s *Source) ClientCredentials() credentials.TransportCredentials {
	return s.ReportingClientCredentials(nil)
}

// ReportingClientCredentials are ClientCredentials that also call
// onRefused (when not nil) with the peer's address and the error of each
// certificate refusal, from gRPC's connecting goroutine: it must not block.
func (s *Source) ReportingClientCredentials(onRefused func(peer string, err error)) credentials.TransportCredentials {
	return &refusingCreds{TransportCredentials: credentials.NewTLS(s.ClientConfig()), onRefused: onRefused}
}

type serverCreds struct {
	credentials.TransportCredentials
	s *Source
}

func (c *serverCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	nc, ai, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.s.m.Refused(ReasonTLSHandshake)
		c.s.failLog.Warn().Err(err).Str("remote", conn.RemoteAddr().String()).
			Str("reason", ReasonTLSHandshake).Msg("Peer refused: TLS handshake failed")
	}
	return nc, ai, err
}

func (c *serverCreds) Clone() credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: c.TransportCredentials.Clone(), s: c.s}
}
