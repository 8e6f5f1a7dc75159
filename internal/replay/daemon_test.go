package replay

import (
	"context"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"testing"

	"go.uber.org/goleak"

	pegadv1 "github.com/pegaflow/pegad/api/pegad/v1"
	pegaclient "github.com/pegaflow/pegad/client"
	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// synthetic is a trace of n requests over docs shared prefixes of docLen
// blocks each, every request adding tail fresh blocks: prefix reuse as in
// chat and RAG traces, small enough for a 1 MiB pool to matter.
func synthetic(n, docs, docLen, tail int) []Request {
	r := rand.New(rand.NewPCG(1, 2))
	next := uint64(docs * docLen)
	reqs := make([]Request, n)
	for i := range reqs {
		d := r.IntN(docs)
		use := 1 + r.IntN(docLen)
		for j := 0; j < use; j++ {
			reqs[i].HashIDs = append(reqs[i].HashIDs, uint64(d*docLen+j))
		}
		for j := 0; j < tail; j++ {
			reqs[i].HashIDs = append(reqs[i].HashIDs, next)
			next++
		}
	}
	return reqs
}

// prefixUnbounded is the prefix hit ratio with a cache that keeps all.
func prefixUnbounded(reqs []Request) Ratio {
	var r Ratio
	seen := map[uint64]bool{}
	for _, req := range reqs {
		n := 0
		for n < len(req.HashIDs) && seen[req.HashIDs[n]] {
			n++
		}
		r.Hits += uint64(n)
		r.Accesses += uint64(len(req.HashIDs))
		for _, h := range req.HashIDs {
			seen[h] = true
		}
	}
	return r
}

type target struct {
	c    *pegaclient.Client
	node *cluster.Node
}

func (tg target) resident(ctx context.Context) (uint64, error) {
	st, err := tg.node.Admin.Stats(ctx, &pegadv1.StatsRequest{})
	return st.GetBlocks(), err
}

func startTarget(t *testing.T, pool config.ByteSize) target {
	t.Helper()
	n := cluster.Start(t, cluster.WithConfig(func(c *config.Config) {
		c.MetricsListen = ""
		c.PoolSize = pool
	}))
	return target{c: n.Client(t), node: n}
}

func TestDriveAgainstDaemon(t *testing.T) {
	reqs := synthetic(300, 12, 40, 4)
	_, uniq := Stats(reqs)
	const bs = 4 << 10
	ctx := context.Background()

	t.Run("everything fits", func(t *testing.T) {
		tg := startTarget(t, config.ByteSize(4*uniq*bs))
		res, err := Drive(ctx, tg.c, reqs, Options{Namespace: "replay", BlockSize: bs, Resident: tg.resident})
		if err != nil {
			t.Fatal(err)
		}
		if want := prefixUnbounded(reqs); res.Ratio != want {
			t.Errorf("hits %+v, want the unbounded cache's %+v", res.Ratio, want)
		}
		if res.Stored != uint64(uniq) || res.Dropped != 0 || res.CapacityBlocks != uint64(uniq) {
			t.Errorf("stored %d dropped %d capacity %d, want %d, 0, %d", res.Stored, res.Dropped, res.CapacityBlocks, uniq, uniq)
		}
	})

	t.Run("pool holds a fraction", func(t *testing.T) {
		tg := startTarget(t, config.MinPoolSize) // 1 MiB: at most 256 blocks of 4 KiB
		res, err := Drive(ctx, tg.c, reqs, Options{Namespace: "replay", BlockSize: bs, Resident: tg.resident})
		if err != nil {
			t.Fatal(err)
		}
		c := int(res.CapacityBlocks)
		if c == 0 || c > int(config.MinPoolSize)/bs || c >= uniq {
			t.Fatalf("capacity %d blocks (unique %d)", c, uniq)
		}
		// Prefix hits are at most the per-block hits of the same cache,
		// and no policy beats Belady's per-block hits at its capacity.
		if b := Belady(reqs, c); res.Hits > b.Hits || res.Hits == 0 {
			t.Errorf("daemon hits %d, Belady at %d blocks %d", res.Hits, c, b.Hits)
		}
		if res.Accesses != prefixUnbounded(reqs).Accesses || res.Hits >= prefixUnbounded(reqs).Hits {
			t.Errorf("daemon %+v vs unbounded %+v: a 1 MiB pool cannot hit as often", res.Ratio, prefixUnbounded(reqs))
		}
	})

	t.Run("wrong bytes fail the replay", func(t *testing.T) {
		tg := startTarget(t, config.ByteSize(4*uniq*bs))
		first := reqs[0].HashIDs[0]
		bad := make([]byte, bs)
		fill(bad, first+1) // another block's bytes under first's key
		if err := tg.c.Put(ctx, "replay", binary.BigEndian.AppendUint64(nil, first), bad); err != nil {
			t.Fatalf("put: %v", err)
		}
		_, err := Drive(ctx, tg.c, reqs, Options{Namespace: "replay", BlockSize: bs})
		if !errors.Is(err, ErrWrongBytes) {
			t.Fatalf("Drive over a corrupted block: %v, want ErrWrongBytes", err)
		}
	})
}
