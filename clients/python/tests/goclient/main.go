// Command goclient is the Go side of the Python client's tests: it puts and
// gets blocks with the public Go client (client/), so the tests check that
// both clients agree on the bytes and the slot layout.
//
//	goclient put SOCKET NS HASHHEX FILE [K:V ...]   # Alloc with the slots (default one), write FILE, Commit
//	goclient get SOCKET NS HASHHEX OUT               # Lease, write the segments, print the slots as K:V
//
// It is a test helper only: it must never be imported or shipped.
package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/pegaflow/pegad/client"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "goclient:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 5 {
		return fmt.Errorf("usage: goclient put|get SOCKET NS HASHHEX FILE [K:V ...]")
	}
	cmd, sock, ns, file := args[0], args[1], args[2], args[4]
	hash, err := hex.DecodeString(args[3])
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, err := client.Dial(ctx, sock)
	if err != nil {
		return err
	}
	defer c.Close()
	switch cmd {
	case "put":
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		var slots []client.SlotSize
		for _, s := range args[5:] {
			k, v, _ := strings.Cut(s, ":")
			kn, err1 := strconv.ParseUint(k, 10, 64)
			vn, err2 := strconv.ParseUint(v, 10, 64)
			if err1 != nil || err2 != nil {
				return fmt.Errorf("slot %q: want K:V", s)
			}
			slots = append(slots, client.SlotSize{K: kn, V: vn})
		}
		var opts []client.PutOption
		if slots != nil {
			opts = append(opts, client.WithSlots(slots...))
		}
		w, err := c.Alloc(ctx, ns, hash, len(data), opts...)
		if err != nil {
			return err
		}
		copy(w.Bytes(), data)
		return w.Commit(ctx)
	case "get":
		r, err := c.Lease(ctx, ns, hash)
		if err != nil {
			return err
		}
		f, err := os.Create(file)
		if err != nil {
			_ = r.Release()
			return err
		}
		var layout []string
		var werr error
		for _, s := range r.Slots() {
			layout = append(layout, fmt.Sprintf("%d:%d", len(s.K), len(s.V)))
			for _, seg := range [][]byte{s.K, s.V} {
				if _, err := f.Write(seg); err != nil && werr == nil {
					werr = err
				}
			}
		}
		if err := errors.Join(werr, f.Close()); err != nil {
			_ = r.Release()
			return err
		}
		fmt.Println(strings.Join(layout, " "))
		return r.Release()
	}
	return fmt.Errorf("unknown command %q", cmd)
}
