package ctl

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
)

// Cluster commands: what the cluster index (pegad --cluster-redis) says
// about nodes and blocks, through the local pegad (docs/cluster.md).

// NewNodesCommand groups the commands on cluster membership.
func NewNodesCommand(g *globalFlags) *cobra.Command {
	cmd := newGroupCommand("nodes", "Nodes of the cluster index (pegad --cluster-redis)")
	cmd.AddCommand(newNodesListCommand(g))
	return cmd
}

func newNodesListCommand(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "list",
		Short: "List the live nodes registered in the cluster index",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var res *pegadv1.ListNodesResponse
			err := g.withClient(cmd.Context(), func(ctx context.Context, c *pegaclient.Client) error {
				var err error
				res, err = c.Cluster().ListNodes(ctx, &pegadv1.ListNodesRequest{})
				return err
			})
			if err != nil {
				return err
			}
			return g.printer(cmd.OutOrStdout()).print(nodesOf(res))
		},
	}
}

type nodeJSON struct {
	NodeID           string  `json:"node_id"`
	Advertise        string  `json:"advertise"`
	Incarnation      string  `json:"incarnation"`
	Transport        string  `json:"transport"`
	PoolSize         uint64  `json:"pool_size"`
	FreeBytes        uint64  `json:"free_bytes"`
	StartedAt        string  `json:"started_at"`
	ExpiresInSeconds float64 `json:"expires_in_seconds"`
	Self             bool    `json:"self"`
}

type nodesResult struct {
	Nodes []nodeJSON `json:"nodes"`
}

func nodesOf(res *pegadv1.ListNodesResponse) *nodesResult {
	out := &nodesResult{Nodes: []nodeJSON{}}
	for _, n := range res.GetNodes() {
		out.Nodes = append(out.Nodes, nodeJSON{
			NodeID: n.GetNodeId(), Advertise: n.GetAdvertise(), Incarnation: n.GetIncarnation(),
			Transport: n.GetTransport(), PoolSize: n.GetPoolSize(), FreeBytes: n.GetFreeBytes(),
			StartedAt: timestamp(n.GetStartedAt()), ExpiresInSeconds: roundMillis(seconds(n.GetExpiresIn())),
			Self: n.GetSelf(),
		})
	}
	return out
}

func (r *nodesResult) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "NODE\tADVERTISE\tINCARNATION\tTRANSPORT\tPOOL\tFREE\tSTARTED\tEXPIRES_IN")
	for _, n := range r.Nodes {
		id := n.NodeID
		if n.Self {
			id += " (self)"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", id, n.Advertise, n.Incarnation, n.Transport,
			humanBytes(n.PoolSize), humanBytes(n.FreeBytes), n.StartedAt, humanSeconds(n.ExpiresInSeconds))
	}
	return nil
}

// NewBlocksWhereCommand asks the cluster index which nodes hold blocks.
func NewBlocksWhereCommand(g *globalFlags) *cobra.Command {
	var namespace string
	cmd := &cobra.Command{
		Use:   "where --namespace NS HEX...",
		Short: "Show which live nodes the cluster index says hold each block (a hint, not a guarantee)",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf("%s needs at least one block hash", cmd.CommandPath())
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if namespace == "" {
				return usageErrorf("--namespace is required")
			}
			req := &pegadv1.LocateBlocksRequest{Namespace: namespace}
			for _, a := range args {
				h, err := parseHash(a)
				if err != nil {
					return err
				}
				req.Hashes = append(req.Hashes, h)
			}
			// One LocateBlocks per batch of the request limit (batch.go).
			res := &pegadv1.LocateBlocksResponse{}
			for _, hashes := range batches(req.Hashes) {
				err := g.withClient(cmd.Context(), func(ctx context.Context, c *pegaclient.Client) error {
					one, err := c.Cluster().LocateBlocks(ctx, &pegadv1.LocateBlocksRequest{Namespace: namespace, Hashes: hashes})
					res.Blocks = append(res.Blocks, one.GetBlocks()...)
					return err
				})
				if err != nil {
					return err
				}
			}
			out := whereOf(namespace, res)
			if err := g.printer(cmd.OutOrStdout()).print(out); err != nil {
				return err
			}
			if n := out.unheld(); n == len(out.Blocks) {
				return notFoundErrorf("no live node holds any of the %d blocks", n)
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&namespace, "namespace", "", "block namespace (required)")
	return cmd
}

type holderJSON struct {
	NodeID      string `json:"node_id"`
	Advertise   string `json:"advertise"`
	Incarnation string `json:"incarnation"`
}

type whereBlockJSON struct {
	Hash    string       `json:"hash"`
	Holders []holderJSON `json:"holders"`
}

type whereResult struct {
	Namespace string           `json:"namespace"`
	Blocks    []whereBlockJSON `json:"blocks"`
}

func whereOf(ns string, res *pegadv1.LocateBlocksResponse) *whereResult {
	out := &whereResult{Namespace: ns, Blocks: []whereBlockJSON{}}
	for _, b := range res.GetBlocks() {
		bj := whereBlockJSON{Hash: hexOf(b.GetHash()), Holders: []holderJSON{}}
		for _, h := range b.GetHolders() {
			bj.Holders = append(bj.Holders, holderJSON{NodeID: h.GetNodeId(), Advertise: h.GetAdvertise(), Incarnation: h.GetIncarnation()})
		}
		out.Blocks = append(out.Blocks, bj)
	}
	return out
}

func (r *whereResult) unheld() int {
	n := 0
	for _, b := range r.Blocks {
		if len(b.Holders) == 0 {
			n++
		}
	}
	return n
}

func (r *whereResult) writeTable(w io.Writer) error {
	fmt.Fprintln(w, "HASH\tHOLDERS")
	for _, b := range r.Blocks {
		hs := make([]string, len(b.Holders))
		for i, h := range b.Holders {
			hs[i] = h.NodeID + "@" + h.Advertise
		}
		s := strings.Join(hs, ",")
		if s == "" {
			s = "-"
		}
		fmt.Fprintf(w, "%s\t%s\n", b.Hash, s)
	}
	return nil
}
