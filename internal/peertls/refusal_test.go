package peertls_test

import (
	"errors"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/pegaflow/pegad/api/pegaderr"
	"github.com/pegaflow/pegad/internal/peertls"
	"github.com/pegaflow/pegad/internal/testutil"
)

// TestRefusalReported (issue 23): a handshake refused for a certificate,
// in either direction, fails with an error IsRefusal recognises (from the
// status gRPC returns) and is reported once per channel attempt with the
// peer's address and which side refused; a peer that is not there is no
// refusal, and nothing is reported.
func TestRefusalReported(t *testing.T) {
	ca, rogue := testutil.NewCA(t, "cluster"), testutil.NewCA(t, "rogue")
	addr, _ := server(t, source(t, files(t, ca, "holder"), "", nil, zerolog.Nop()))

	// The holder refuses: the client trusts the cluster CA (so it accepts
	// the holder) but presents a rogue certificate. Under TLS 1.3 the
	// holder's alert arrives after the client's side of the handshake.
	rf := files(t, rogue, "node-x")
	rf.CA = ca.WriteCA(t, t.TempDir())
	holderRefuses, err := peertls.NewUnchecked(rf)
	if err != nil {
		t.Fatal(err)
	}
	// This node refuses: it trusts only the rogue CA.
	nodeRefuses := source(t, files(t, rogue, "node-x"), "", nil, zerolog.Nop())

	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()

	tests := []struct {
		name, addr string
		src        *peertls.Source
		want       string // "" for no refusal
	}{
		{"holder refuses this node's certificate", addr, holderRefuses, "the peer refused this node's certificate"},
		{"this node refuses the holder's", addr, nodeRefuses, "this node refused the peer's certificate"},
		{"no one listening", closedAddr, nodeRefuses, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex // guards reports
			var reports []string
			creds := tc.src.ReportingClientCredentials(func(peer string, err error) {
				mu.Lock()
				defer mu.Unlock()
				reports = append(reports, peer+" "+err.Error())
			})
			cc, err := grpc.NewClient("passthrough:///"+tc.addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			err = check(t, cc)
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("check: %v, want Unavailable", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if tc.want == "" {
				if peertls.IsRefusal(err) || len(reports) != 0 {
					t.Fatalf("a dead peer counted as a refusal: %v, reports %q", err, reports)
				}
				return
			}
			if !peertls.IsRefusal(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("check: %v; want a refusal saying %q", err, tc.want)
			}
			if len(reports) == 0 || !strings.HasPrefix(reports[0], tc.addr+" ") || !strings.Contains(reports[0], tc.want) {
				t.Fatalf("reports %q, want %s saying %q", reports, tc.addr, tc.want)
			}
		})
	}
}

// TestIsRefusal: which peer-port statuses are certificate refusals.
func TestIsRefusal(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"marked", errors.Join(errors.New("x"), peertls.ErrRefused), true},
		{"off the allow-list", pegaderr.Status(codes.PermissionDenied, pegaderr.Authentication, "identity x").Err(), true},
		{"node id not proven", pegaderr.Status(codes.PermissionDenied, pegaderr.Identity, "claims y").Err(), true},
		{"older holder, no reason", status.Error(codes.PermissionDenied, "identity x is not allowed"), false},
		{"another's session", pegaderr.Status(codes.PermissionDenied, pegaderr.NotOwner, "not yours").Err(), false},
		{"broken link", status.Error(codes.Unavailable, "connection reset by peer"), false},
		{"plain error", errors.New("boom"), false},
		{"nil", nil, false},
	}
	for _, tc := range tests {
		if got := peertls.IsRefusal(tc.err); got != tc.want {
			t.Errorf("%s: IsRefusal(%v) = %v, want %v", tc.name, tc.err, got, tc.want)
		}
	}
}
