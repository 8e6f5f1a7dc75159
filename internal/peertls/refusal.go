package peertls

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/api/pegaderr"
)

// Certificate refusals on the requester side. A handshake that fails for
// identity (the holder refused this node's certificate, or this node
// refused the holder's) is a permission problem: redialling cannot fix it
// until a certificate, a CA or an allow-list changes. The client
// credentials tell their owner about each refusal (OnRefused), so it can
// stop dialling that peer, and mark the error with ErrRefused so callers
// can tell it from a broken link.

// ErrRefused marks a certificate refusal. gRPC keeps only a failed
// handshake's text in the status it returns, so IsRefusal also finds this
// text in a status message.
var ErrRefused = errors.New("certificate refused")

// ErrNotAllowed: the holder's certificate is valid but its identity is not
// on this node's --peer-allow.
var ErrNotAllowed = errors.New("not on --peer-allow")

// IsRefusal reports whether err is a certificate refusal: it wraps
// ErrRefused, or is a gRPC status saying so (the text a failed handshake
// leaves), or a peer port's refusal of a verified certificate (reason
// AUTHENTICATION: off the holder's allow-list; IDENTITY: a node id the
// certificate does not prove). A PermissionDenied without a reason is not
// one: it may be any refusal of an older holder.
func IsRefusal(err error) bool {
	if err == nil {
		return false
	}
	if errors.Is(err, ErrRefused) {
		return true
	}
	st, ok := status.FromError(err)
	if !ok {
		return false
	}
	switch _, reason := pegaderr.FromStatus(err); reason {
	case pegaderr.Authentication, pegaderr.Identity:
		return true
	}
	return strings.Contains(st.Message(), ErrRefused.Error()+": ")
}

// refusedAlerts are the TLS alerts by which a holder refuses the client
// certificate (RFC 8446 section 6.2): bad_certificate (42) to
// certificate_unknown (46), unknown_ca (48), access_denied (49) and
// certificate_required (116). crypto/tls reports a received alert as a
// net.OpError "remote error" around its unexported alert type, so they
// are matched by that type's text.
var refusedAlerts = map[string]bool{
	"tls: bad certificate": true, "tls: unsupported certificate": true, "tls: revoked certificate": true,
	"tls: expired certificate": true, "tls: unknown certificate": true, "tls: unknown certificate authority": true,
	"tls: access denied": true, "tls: certificate required": true,
}

// refusal says what certificate problem err is, if it is one: the
// holder's alert refusing ours, or this node's verification of the
// holder's. Network errors, timeouts and EOFs are not.
func refusal(err error) (string, bool) {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "remote error" && op.Err != nil && refusedAlerts[op.Err.Error()] {
		return "the peer refused this node's certificate (" + op.Err.Error() + "): check that this node's certificate is signed by the peer's --peer-tls-ca and is on its --peer-allow", true
	}
	var (
		unknown  x509.UnknownAuthorityError
		invalid  x509.CertificateInvalidError
		verifyCE *tls.CertificateVerificationError
	)
	if errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &verifyCE) || errors.Is(err, ErrNotAllowed) {
		return "this node refused the peer's certificate (" + err.Error() + "): check the peer's certificate against this node's --peer-tls-ca and --peer-allow", true
	}
	return "", false
}

// refusingCreds are client credentials that report certificate refusals
// to onRefused, keyed by the dialled authority (the peer's host:port).
type refusingCreds struct {
	credentials.TransportCredentials
	onRefused func(peer string, err error)
}

// ClientHandshake runs the TLS handshake. Under TLS 1.3 a holder refuses
// the client certificate only after the client's side of the handshake is
// done, so its alert arrives on the first read, and gRPC, writing its
// preface first, may see only "broken pipe". So the first read happens
// here: a holder that accepted the certificate always speaks first (its
// HTTP/2 SETTINGS), and those bytes are handed to gRPC unchanged.
func (c *refusingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	nc, ai, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, c.refused(authority, err)
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(firstReadTimeout)
	}
	buf := make([]byte, 4096)
	_ = nc.SetReadDeadline(deadline)
	n, err := nc.Read(buf)
	_ = nc.SetReadDeadline(time.Time{})
	if err != nil && n == 0 {
		nc.Close()
		return nil, nil, c.refused(authority, err)
	}
	return &peekedConn{Conn: nc, buf: buf[:n]}, ai, nil
}

// firstReadTimeout bounds the wait for a holder's first bytes when the
// handshake's context has no deadline.
const firstReadTimeout = 20 * time.Second

// refused reports err to onRefused when it is a certificate refusal and
// returns it marked with ErrRefused; any other error unchanged.
func (c *refusingCreds) refused(peer string, err error) error {
	why, ok := refusal(err)
	if !ok {
		return err
	}
	marked := fmt.Errorf("%w: %s", ErrRefused, why)
	if c.onRefused != nil {
		c.onRefused(peer, marked)
	}
	return marked
}

func (c *refusingCreds) Clone() credentials.TransportCredentials {
	return &refusingCreds{TransportCredentials: c.TransportCredentials.Clone(), onRefused: c.onRefused}
}

// peekedConn is a connection whose first bytes were read already: Read
// returns them first. Only gRPC's reading goroutine calls Read.
type peekedConn struct {
	net.Conn
	buf []byte // read during the handshake, not yet returned
}

func (p *peekedConn) Read(b []byte) (int, error) {
	if len(p.buf) > 0 {
		n := copy(b, p.buf)
		p.buf = p.buf[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}
