package testutil

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// refuser refuses every PutBlock once it has read the header, as pegad
// refuses a bad key, before any data is read.
type refuser struct {
	pegadv1.UnimplementedLocalServiceServer
}

func (refuser) PutBlock(s pegadv1.LocalService_PutBlockServer) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	return status.Error(codes.InvalidArgument, "refused after the header")
}

// TestPutBlockRefusedHeader: a PutBlock the server refuses after its
// header reports the server's status, not the io.EOF that the next Send
// returns once the stream is over (a body larger than the stream's flow
// control window makes that Send certain to meet the end). It returned
// that EOF before, and TestNamespaceControlCharsRefused failed so under
// load.
func TestPutBlockRefusedHeader(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pegadv1.RegisterLocalServiceServer(srv, refuser{})
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	_, err = PutBlock(ctx, pegadv1.NewLocalServiceClient(cc), "ns", []byte("h"), make([]byte, 16<<20), false)
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("PutBlock = %v, want the server's InvalidArgument", err)
	}
}
