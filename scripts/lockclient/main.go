// Command lockclient plays a requester's part of the holder protocol for
// the end-to-end scripts: it locks blocks on a pegad's peer port with
// QueryBlocksForTransfer and releases the session with ReleaseTransferLock,
// without any RDMA. It is a test tool, not an operator's tool.
//
//	lockclient query   --peer HOST:PORT --namespace NS [--requester ID] HEX...
//	    prints the session id (one line); exit 1 when nothing was locked
//	lockclient release --peer HOST:PORT [--requester ID] SESSION_ID
//	    prints "released_blocks=N was_live=BOOL end=NAME"
package main

import (
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "lockclient: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("usage: lockclient query|release [flags] ARGS")
	}
	fs := flag.NewFlagSet("lockclient "+args[0], flag.ContinueOnError)
	peer := fs.String("peer", "", "holder's peer address HOST:PORT")
	ns := fs.String("namespace", "", "block namespace (query)")
	requester := fs.String("requester", "e2e-lockclient", "requester node id")
	incarnation := fs.String("incarnation", "e2e", "requester incarnation")
	timeout := fs.Duration("timeout", 10*time.Second, "RPC deadline")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if *peer == "" {
		return fmt.Errorf("--peer is required")
	}
	conn, err := grpc.NewClient("passthrough:///"+*peer, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	c := pegadv1.NewPeerServiceClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	who := &pegadv1.Requester{NodeId: *requester, Incarnation: *incarnation}

	switch args[0] {
	case "query":
		if *ns == "" || fs.NArg() == 0 {
			return fmt.Errorf("query needs --namespace and at least one hash")
		}
		var hashes [][]byte
		for _, h := range fs.Args() {
			b, err := hex.DecodeString(h)
			if err != nil {
				return fmt.Errorf("hash %q: %w", h, err)
			}
			hashes = append(hashes, b)
		}
		res, err := c.QueryBlocksForTransfer(ctx, &pegadv1.QueryBlocksForTransferRequest{
			Namespace: *ns, Hashes: hashes, RequesterId: *requester, Requester: who,
		})
		if err != nil {
			return fmt.Errorf("QueryBlocksForTransfer: %w", err)
		}
		fmt.Fprintf(os.Stderr, "locked %d blocks (%d missing), lock timeout %s\n",
			len(res.GetBlocks()), len(res.GetMissing()), res.GetLockTimeout().AsDuration())
		if res.GetSessionId() == "" {
			return fmt.Errorf("no session: none of the blocks was found")
		}
		fmt.Println(res.GetSessionId())
	case "release":
		if fs.NArg() != 1 {
			return fmt.Errorf("release needs exactly one SESSION_ID")
		}
		res, err := c.ReleaseTransferLock(ctx, &pegadv1.ReleaseTransferLockRequest{
			SessionId: fs.Arg(0), RequesterId: *requester, Requester: who,
		})
		if err != nil {
			return fmt.Errorf("ReleaseTransferLock: %w", err)
		}
		fmt.Printf("released_blocks=%d was_live=%t end=%s\n", res.GetReleasedBlocks(), res.GetWasLive(), res.GetEnd())
	default:
		return fmt.Errorf("unknown subcommand %q: want query or release", args[0])
	}
	return nil
}
