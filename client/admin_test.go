package client_test

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/client"
)

// TestServiceAccessors: Admin, Cluster and Local reach the daemon over the
// client's one connection, with its typed errors; WithoutDataSocket dials
// nothing but the API socket.
func TestServiceAccessors(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t, client.WithoutDataSocket())
	if c.ZeroCopy() {
		t.Fatal("ZeroCopy with WithoutDataSocket")
	}
	ctx := context.Background()
	if err := c.Put(ctx, "ns", []byte("k"), pattern(4096, 1)); err != nil {
		t.Fatalf("Put (streamed): %v", err)
	}
	st, err := c.Admin().Stats(ctx, &pegadv1.StatsRequest{})
	if err != nil || st.GetBlocks() != 1 {
		t.Fatalf("Admin().Stats: %v, %d blocks; want 1", err, st.GetBlocks())
	}
	if v, err := c.Admin().Version(ctx, &pegadv1.VersionRequest{}); err != nil || v.GetVersion() == "" {
		t.Fatalf("Admin().Version: %v %+v", err, v)
	}
	list, err := c.Local().ListBlocks(ctx, &pegadv1.ListBlocksRequest{Namespace: "ns"})
	if err != nil || len(list.GetBlocks()) != 1 {
		t.Fatalf("Local().ListBlocks: %v, %d blocks; want 1", err, len(list.GetBlocks()))
	}
	// No --cluster-redis: the typed error, its status kept.
	_, err = c.Cluster().ListNodes(ctx, &pegadv1.ListNodesRequest{})
	if !errors.Is(err, client.ErrNoIndex) || status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Cluster().ListNodes without an index: %v (%v), want ErrNoIndex, FailedPrecondition", err, status.Code(err))
	}
	_, err = c.Admin().ReleaseLock(ctx, &pegadv1.ReleaseLockRequest{SessionId: "no-such-session"})
	if status.Code(err) == codes.OK || status.Code(err) == codes.Unknown {
		t.Fatalf("ReleaseLock of an unknown session: %v, want a status", err)
	}
}

// TestDeleteWasDeferred: Delete says whether a pin keeps the block's
// memory after it left the index.
func TestDeleteWasDeferred(t *testing.T) {
	n := startNode(t, nil)
	c := n.dial(t)
	ctx := context.Background()
	for _, k := range []string{"free", "leased"} {
		if err := c.Put(ctx, "ns", []byte(k), pattern(4096, 2)); err != nil {
			t.Fatal(err)
		}
	}
	r, err := c.Lease(ctx, "ns", []byte("leased"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Release()
	for k, want := range map[string]bool{"free": false, "leased": true} {
		deferred := !want
		if err := c.Delete(ctx, "ns", []byte(k), client.WasDeferred(&deferred)); err != nil {
			t.Fatalf("Delete %s: %v", k, err)
		}
		if deferred != want {
			t.Errorf("Delete %s: deferred %v, want %v", k, deferred, want)
		}
	}
	deferred := true
	if err := c.Delete(ctx, "ns", []byte("free"), client.WasDeferred(&deferred)); !errors.Is(err, client.ErrNotFound) || deferred {
		t.Fatalf("Delete of a deleted block: %v, deferred %v; want ErrNotFound, false", err, deferred)
	}
}

// TestSocketError: no daemon on the socket is a SocketError naming the
// socket and the cause, whichever socket the client found missing.
func TestSocketError(t *testing.T) {
	dir := shortDir(t)
	sock := filepath.Join(dir, "none.sock")
	ctx := context.Background()

	_, err := client.Dial(ctx, sock)
	var se *client.SocketError
	if !errors.As(err, &se) || se.Socket != sock+client.DataSocketSuffix {
		t.Fatalf("Dial without a daemon: %v, want a SocketError on the data socket", err)
	}

	c, err := client.Dial(ctx, sock, client.WithoutDataSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for name, call := range map[string]func() error{
		"Admin().Stats": func() error { _, err := c.Admin().Stats(ctx, &pegadv1.StatsRequest{}); return err },
		"Delete":        func() error { return c.Delete(ctx, "ns", []byte("k")) },
		"Put (stream)":  func() error { return c.Put(ctx, "ns", []byte("k"), []byte("v")) },
	} {
		err := call()
		se = nil
		if !errors.As(err, &se) || se.Socket != sock {
			t.Fatalf("%s: %v, want a SocketError on %s", name, err, sock)
		}
		if !errors.Is(err, client.ErrUnavailable) || !errors.Is(err, fs.ErrNotExist) || status.Code(err) != codes.Unavailable {
			t.Errorf("%s: %v matches ErrUnavailable %v, fs.ErrNotExist %v, code %v",
				name, err, errors.Is(err, client.ErrUnavailable), errors.Is(err, fs.ErrNotExist), status.Code(err))
		}
		if want := "cannot reach pegad at " + sock + ": connect: no such file or directory"; err.Error() != want {
			t.Errorf("%s: %q, want %q", name, err, want)
		}
	}
}

// bigAdmin answers ListSessions with more than gRPC's default 4 MiB.
type bigAdmin struct {
	pegadv1.UnimplementedAdminServiceServer
}

func (bigAdmin) ListSessions(context.Context, *pegadv1.ListSessionsRequest) (*pegadv1.ListSessionsResponse, error) {
	res := &pegadv1.ListSessionsResponse{}
	for range 5 {
		res.Sessions = append(res.Sessions, &pegadv1.HolderSession{SessionId: strings.Repeat("s", 1<<20)})
	}
	return res, nil
}

// TestLargeAnswer: list answers larger than gRPC's default limit arrive.
func TestLargeAnswer(t *testing.T) {
	sock := filepath.Join(shortDir(t), "big.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pegadv1.RegisterAdminServiceServer(srv, bigAdmin{})
	go func() { _ = srv.Serve(l) }()
	defer srv.Stop()
	c, err := client.Dial(context.Background(), sock, client.WithoutDataSocket())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	res, err := c.Admin().ListSessions(context.Background(), &pegadv1.ListSessionsRequest{})
	if err != nil || len(res.GetSessions()) != 5 {
		t.Fatalf("ListSessions of 5 MiB: %v", err)
	}
}

// shortDir is a directory for unix sockets, whose paths are limited to 108
// bytes (t.TempDir embeds the test's name).
func shortDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pgc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
