package testutil

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
)

// PutBlock stores body as a one-slot block through the local API, streamed
// in 1 MiB data messages as pegactl sends it; kv splits the slot into a K
// and a V half.
func PutBlock(ctx context.Context, c pegadv1.LocalServiceClient, ns string, hash, body []byte, kv bool) (*pegadv1.PutBlockResponse, error) {
	s, err := c.PutBlock(ctx)
	if err != nil {
		return nil, err
	}
	slot := &pegadv1.SlotSize{KSize: uint64(len(body))}
	if kv {
		slot = &pegadv1.SlotSize{KSize: uint64(len(body) / 2), VSize: uint64(len(body) - len(body)/2)}
	}
	if err := s.Send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Header{Header: &pegadv1.PutBlockHeader{
		Namespace: ns, Hash: hash, Slots: []*pegadv1.SlotSize{slot}}}}); err != nil {
		return nil, sendErr(s, err)
	}
	for rest := body; len(rest) > 0; {
		k := min(len(rest), 1<<20)
		if err := s.Send(&pegadv1.PutBlockRequest{Msg: &pegadv1.PutBlockRequest_Data{Data: rest[:k]}}); err != nil {
			return nil, sendErr(s, err)
		}
		rest = rest[k:]
	}
	return s.CloseAndRecv()
}

// sendErr is the error of a failed Send: io.EOF says the server ended the
// stream (a refused header, answered before the data was sent), whose
// status only a receive reads (grpc.ClientStream.SendMsg).
func sendErr(s pegadv1.LocalService_PutBlockClient, err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	if _, rerr := s.CloseAndRecv(); rerr != nil {
		return rerr
	}
	return err
}

// GetBlock reads a block's bytes (slot order) through the local API.
func GetBlock(ctx context.Context, c pegadv1.LocalServiceClient, ns string, hash []byte) ([]byte, error) {
	s, err := c.GetBlock(ctx, &pegadv1.GetBlockRequest{Namespace: ns, Hash: hash})
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return buf.Bytes(), nil
		}
		if err != nil {
			return nil, err
		}
		buf.Write(m.GetData())
	}
}

// ScrapeMetrics reads http://addr/metrics as "name{labels}" → value.
func ScrapeMetrics(hc *http.Client, addr string) (map[string]float64, error) {
	resp, err := hc.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		out[line[:i]] = v
	}
	return out, sc.Err()
}
