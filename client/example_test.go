package client_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"os"
	"path/filepath"

	"github.com/rs/zerolog"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	"github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/daemon"
	"github.com/pegaflow/pegad/internal/testutil"
)

func Example() {
	// A pegad to talk to; an engine dials the node's running daemon instead
	// (its --socket, /run/pegad/pegad.sock by default).
	dir, _ := os.MkdirTemp("", "pegad")
	defer os.RemoveAll(dir)
	d, err := daemon.Start(context.Background(), testutil.LoopbackConfig("example", filepath.Join(dir, "p.sock")),
		daemon.WithLogger(zerolog.Nop()), daemon.WithNotify(func(string) {}))
	if err != nil {
		log.Fatal(err)
	}
	defer d.Close()

	ctx := context.Background()
	c, err := client.Dial(ctx, d.SocketPath())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()

	// Write a block in place: K and V of one slot, 8 bytes each.
	w, err := c.Alloc(ctx, "llama-70b", []byte{0xab, 0xcd}, 16, client.WithSlots(client.SlotSize{K: 8, V: 8}))
	if err != nil {
		log.Fatal(err)
	}
	copy(w.Bytes(), "KKKKKKKKVVVVVVVV")
	if err := w.Commit(ctx); err != nil {
		log.Fatal(err)
	}

	// Read it in place, pinned until Release.
	r, err := c.Lease(ctx, "llama-70b", []byte{0xab, 0xcd})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %s\n", r.Slots()[0].K, r.Slots()[0].V)
	_ = r.Release()

	// Or with one copy each way.
	_ = c.Put(ctx, "llama-70b", []byte{0x01}, []byte("hello"))
	buf := make([]byte, 64)
	n, _ := c.Get(ctx, "llama-70b", []byte{0x01}, buf)
	fmt.Println(string(buf[:n]))
	// Output:
	// KKKKKKKK VVVVVVVV
	// hello
}

func ExampleClient_Admin() {
	ctx := context.Background()
	// An operator's tool: the API socket only, no data socket.
	c, err := client.Dial(ctx, "/run/pegad/pegad.sock", client.WithoutDataSocket())
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close()
	st, err := c.Admin().Stats(ctx, &pegadv1.StatsRequest{})
	var se *client.SocketError
	switch {
	case errors.As(err, &se) && errors.Is(err, fs.ErrPermission):
		log.Fatalf("no access to %s: join its group", se.Socket)
	case err != nil:
		log.Fatal(err) // "cannot reach pegad at ...: connect: no such file or directory"
	}
	fmt.Println(st.GetBlocks(), "blocks")
}
