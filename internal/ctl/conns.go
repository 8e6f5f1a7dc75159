package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
)

// NewConnsCommand groups the commands on peer connections.
func NewConnsCommand(g *globalFlags) *cobra.Command {
	cmd := newGroupCommand("conns", "RDMA connections to and from peers")
	cmd.AddCommand(newConnsListCommand(g))
	return cmd
}

// connSort are the --sort keys of conns list.
var connSort = sortKeys[connJSON]{
	"peer":  by(func(c connJSON) string { return c.Peer }),
	"node":  by(func(c connJSON) string { return c.RemoteNodeID }),
	"state": by(func(c connJSON) string { return c.State }),
	"role":  by(func(c connJSON) string { return c.Role }),
	"qps":   by(func(c connJSON) uint32 { return c.QPs }),
	"age":   by(func(c connJSON) float64 { return c.AgeSeconds }),
}

func newConnsListCommand(g *globalFlags) *cobra.Command {
	var (
		watch time.Duration
		order string
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List peer connections with their state, peer node and queue pairs per NIC",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := connSort.check(order); err != nil {
				return err
			}
			return g.repeat(cmd, watch, func(ctx context.Context, c *pegaclient.Client) (result, error) {
				res, err := c.Admin().ListConns(ctx, &pegadv1.ListConnsRequest{})
				if err != nil {
					return nil, err
				}
				out := connsOf(res)
				connSort.apply(out.Conns, order)
				return out, nil
			})
		},
	}
	addWatchFlag(cmd, &watch)
	addSortFlag(cmd, &order, connSort)
	return cmd
}

type nicJSON struct {
	NIC       string   `json:"nic"`
	QPs       uint32   `json:"qps"`
	LocalQPNs []uint32 `json:"local_qpns"`
}

type connJSON struct {
	Peer         string `json:"peer"`
	State        string `json:"state"`
	Role         string `json:"role"`
	RemoteNodeID string `json:"remote_node_id"`
	// RemoteAdvertise: holder rows, the requester's advertised address.
	RemoteAdvertise string    `json:"remote_advertise"`
	QPs             uint32    `json:"qps"`
	AgeSeconds      float64   `json:"age_seconds"`
	NICs            []nicJSON `json:"nics"`
}

type connsResult struct {
	Conns []connJSON `json:"conns"`
}

func connsOf(res *pegadv1.ListConnsResponse) *connsResult {
	out := &connsResult{Conns: []connJSON{}}
	for _, c := range res.GetConns() {
		cj := connJSON{
			Peer:            c.GetPeer(),
			State:           c.GetState(),
			Role:            c.GetRole(),
			RemoteNodeID:    c.GetRemoteNodeId(),
			RemoteAdvertise: c.GetRemoteAdvertise(),
			QPs:             c.GetQps(),
			AgeSeconds:      seconds(c.GetAge()),
			NICs:            []nicJSON{},
		}
		for _, n := range c.GetNics() {
			qpns := n.GetLocalQpns()
			if qpns == nil {
				qpns = []uint32{}
			}
			cj.NICs = append(cj.NICs, nicJSON{NIC: n.GetNic(), QPs: n.GetQps(), LocalQPNs: qpns})
		}
		out.Conns = append(out.Conns, cj)
	}
	return out
}

func (r *connsResult) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "PEER\tSTATE\tROLE\tNODE\tNICS\tQPS\tAGE")
	for _, c := range r.Conns {
		nics := make([]string, 0, len(c.NICs))
		for _, n := range c.NICs {
			nics = append(nics, fmt.Sprintf("%s:%d", n.NIC, n.QPs))
		}
		// A holder row names the requester by its advertised address
		// (JSON keeps the connection's own address in peer).
		peer := c.Peer
		if c.RemoteAdvertise != "" {
			peer = c.RemoteAdvertise
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", peer, dash(c.State), dash(c.Role), dash(c.RemoteNodeID),
			dash(strings.Join(nics, ",")), c.QPs, humanSeconds(c.AgeSeconds))
	}
	return nil
}
