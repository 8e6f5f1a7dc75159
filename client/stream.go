package client

import (
	"context"
	"errors"
	"fmt"
	"io"

	"google.golang.org/grpc/status"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// The gRPC streaming path of Put and Get, for a daemon without the data
// socket (AllowStreamFallback).

func statusOf(err error) (*status.Status, bool) { return status.FromError(err) }

func (c *Client) putStream(ctx context.Context, namespace string, hash, data []byte, opts []PutOption, created func(bool)) error {
	slots, err := slotsFor(len(data), opts)
	if err != nil {
		return err
	}
	hdr := &pegadv1.PutBlockHeader{Namespace: namespace, Hash: hash}
	for _, s := range slots {
		hdr.Slots = append(hdr.Slots, &pegadv1.SlotSize{KSize: s.K, VSize: s.V})
	}
	stream, err := c.local.PutBlock(ctx)
	if err != nil {
		return c.grpcErr(err)
	}
	send := func(req *pegadv1.PutBlockRequest) error {
		if err := stream.Send(req); err != nil {
			if errors.Is(err, io.EOF) {
				// The daemon ended the stream early; its status says why.
				_, err = stream.CloseAndRecv()
			}
			return c.grpcErr(err)
		}
		return nil
	}
	if err := send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Header{Header: hdr}}); err != nil {
		return err
	}
	for rest := data; len(rest) > 0; {
		n := min(len(rest), streamChunk)
		if err := send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Data{Data: rest[:n]}}); err != nil {
			return err
		}
		rest = rest[n:]
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return c.grpcErr(err)
	}
	created(resp.GetCreated())
	return nil
}

func (c *Client) getStream(ctx context.Context, namespace string, hash []byte, w io.Writer) (*BlockInfo, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the stream if we stop early
	stream, err := c.local.GetBlock(ctx, &pegadv1.GetBlockRequest{Namespace: namespace, Hash: hash})
	if err != nil {
		return nil, c.grpcErr(err)
	}
	var info *BlockInfo
	var got uint64
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return info, c.grpcErr(err)
		}
		switch m := msg.GetMsg().(type) {
		case *pegadv1.GetBlockResponse_Header:
			if info != nil {
				return info, fmt.Errorf("%w: second header", ErrProtocol)
			}
			info = &BlockInfo{}
			for _, s := range m.Header.GetSlots() {
				info.Slots = append(info.Slots, SlotSize{K: s.GetKSize(), V: s.GetVSize()})
				info.Size += s.GetKSize() + s.GetVSize()
			}
			if fw, ok := w.(*fixedWriter); ok && uint64(len(fw.buf)) < info.Size {
				return info, fmt.Errorf("%w: %d bytes for a block of %d", ErrShortBuffer, len(fw.buf), info.Size)
			}
		case *pegadv1.GetBlockResponse_Data:
			if info == nil {
				return nil, fmt.Errorf("%w: data before the header", ErrProtocol)
			}
			got += uint64(len(m.Data))
			if got > info.Size {
				return info, fmt.Errorf("%w: more than the block's %d bytes", ErrProtocol, info.Size)
			}
			if _, err := w.Write(m.Data); err != nil {
				return info, err
			}
		default:
			return info, fmt.Errorf("%w: empty message", ErrProtocol)
		}
	}
	if info == nil {
		return nil, fmt.Errorf("%w: no header", ErrProtocol)
	}
	if got != info.Size {
		return info, fmt.Errorf("%w: block truncated: got %d of %d bytes", ErrAborted, got, info.Size)
	}
	return info, nil
}

// fixedWriter fills buf and refuses to overflow it.
type fixedWriter struct {
	buf []byte
	n   int
}

func (w *fixedWriter) Write(p []byte) (int, error) {
	if len(p) > len(w.buf)-w.n {
		return 0, ErrShortBuffer
	}
	w.n += copy(w.buf[w.n:], p)
	return len(p), nil
}
