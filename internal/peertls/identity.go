package peertls

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/pegaflow/pegad/api/pegaderr"
)

// Names are the identities a certificate proves: its URI SANs (SPIFFE
// IDs), then its DNS SANs; the subject common name only when it has no SAN.
func Names(c *x509.Certificate) []string {
	var out []string
	for _, u := range c.URIs {
		out = append(out, u.String())
	}
	out = append(out, c.DNSNames...)
	if len(out) == 0 && c.Subject.CommonName != "" {
		out = append(out, c.Subject.CommonName)
	}
	return out
}

// Identity is a certificate's canonical identity, the first of Names: the
// one that owns sessions and that per-peer limits count against.
func Identity(c *x509.Certificate) string {
	if n := Names(c); len(n) > 0 {
		return n[0]
	}
	return ""
}

// MaxAllowPatterns bounds --peer-allow.
const MaxAllowPatterns = 1024

// AllowList is --peer-allow: patterns matched against a certificate's
// Names, '*' standing for any run of characters (including '.' and '/').
// The empty list allows every certificate the CA signed.
type AllowList struct {
	patterns []string
}

// ParseAllowList reads a comma list; blanks around items are ignored.
func ParseAllowList(s string) (AllowList, error) {
	var a AllowList
	if strings.TrimSpace(s) == "" {
		return a, nil
	}
	for _, p := range strings.Split(s, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			return AllowList{}, fmt.Errorf("%q has an empty entry", s)
		}
		a.patterns = append(a.patterns, p)
	}
	if len(a.patterns) > MaxAllowPatterns {
		return AllowList{}, fmt.Errorf("%d entries, at most %d", len(a.patterns), MaxAllowPatterns)
	}
	return a, nil
}

// Empty reports whether the list admits every verified certificate.
func (a AllowList) Empty() bool { return len(a.patterns) == 0 }

// Allows reports whether one of names matches one of the patterns.
func (a AllowList) Allows(names []string) bool {
	if a.Empty() {
		return true
	}
	for _, n := range names {
		for _, p := range a.patterns {
			if glob(p, n) {
				return true
			}
		}
	}
	return false
}

// glob matches s against p where '*' is any run of characters. Iterative
// with one backtrack point, so linear in practice and never exponential.
func glob(p, s string) bool {
	pi, si := 0, 0
	star, mark := -1, 0
	for si < len(s) {
		switch {
		case pi < len(p) && p[pi] == '*':
			star, mark = pi, si
			pi++
		case pi < len(p) && p[pi] == s[si]:
			pi++
			si++
		case star >= 0:
			pi = star + 1
			mark++
			si = mark
		default:
			return false
		}
	}
	for pi < len(p) && p[pi] == '*' {
		pi++
	}
	return pi == len(p)
}

// Peer is a caller authenticated by its certificate.
type Peer struct {
	Identity string   // canonical (Identity)
	Names    []string // every name the certificate proves
}

// Has reports whether the certificate proves name.
func (p Peer) Has(name string) bool {
	for _, n := range p.Names {
		if n == name {
			return true
		}
	}
	return false
}

type ctxKey struct{}

// FromContext is the authenticated caller that the interceptors stored;
// false on a plaintext server.
func FromContext(ctx context.Context) (Peer, bool) {
	p, ok := ctx.Value(ctxKey{}).(Peer)
	return p, ok
}

// verifiedPeer reads the verified client certificate of the gRPC call.
func verifiedPeer(ctx context.Context) (Peer, string, bool) {
	pr, ok := peer.FromContext(ctx)
	if !ok {
		return Peer{}, "", false
	}
	remote := ""
	if pr.Addr != nil {
		remote = pr.Addr.String()
	}
	ti, ok := pr.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return Peer{}, remote, false
	}
	leaf := ti.State.VerifiedChains[0][0]
	return Peer{Identity: Identity(leaf), Names: Names(leaf)}, remote, true
}

// authorize admits a call with a verified certificate on the allow-list
// and returns ctx carrying the Peer.
func (s *Source) authorize(ctx context.Context, method string) (context.Context, error) {
	p, remote, ok := verifiedPeer(ctx)
	if !ok {
		// Unreachable behind ServerCredentials (the handshake requires a
		// verified certificate); refuse rather than trust.
		s.m.Refused(ReasonTLSHandshake)
		return nil, pegaderr.Status(codes.Unauthenticated, pegaderr.Authentication, "peer port requires a client certificate").Err()
	}
	if !s.allow.Allows(p.Names) {
		s.m.Refused(ReasonNotAllowed)
		s.log.Warn().Str("peer", p.Identity).Strs("names", p.Names).Str("remote", remote).
			Str("method", method).Str("reason", ReasonNotAllowed).
			Msg("Peer refused: certificate identity not on --peer-allow")
		return nil, pegaderr.Status(codes.PermissionDenied, pegaderr.Authentication,
			fmt.Sprintf("identity %q is not allowed on this peer port (--peer-allow)", p.Identity)).Err()
	}
	return context.WithValue(ctx, ctxKey{}, p), nil
}

// UnaryInterceptor enforces the allow-list on unary calls and hands the
// Peer to handlers (FromContext).
func (s *Source) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, err := s.authorize(ctx, info.FullMethod)
		if err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor is UnaryInterceptor for streams.
func (s *Source) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx, err := s.authorize(ss.Context(), info.FullMethod)
		if err != nil {
			return err
		}
		return handler(srv, &authedStream{ServerStream: ss, ctx: ctx})
	}
}

type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (a *authedStream) Context() context.Context { return a.ctx }
