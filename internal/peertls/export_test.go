package peertls

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"time"

	"github.com/rs/zerolog"
)

// NewUnchecked is New without checking that the certificate chains to
// the CA (to build a misconfigured holder in the external tests, which
// cannot reach the unexported fields).
func NewUnchecked(f Files) (*Source, error) {
	m, err := loadUnchecked(f)
	if err != nil {
		return nil, err
	}
	s := &Source{files: f, log: zerolog.Nop(), m: nopRecorder{}, now: time.Now}
	s.failLog = s.log
	s.cur.Store(m)
	return s, nil
}

// loadUnchecked loads f without checking that the certificate chains to
// the CA.
func loadUnchecked(f Files) (*material, error) {
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		return nil, err
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, err
	}
	cert.Leaf = leaf
	pem, err := os.ReadFile(f.CA)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pem)
	return &material{cert: &cert, leaf: leaf, roots: roots}, nil
}
