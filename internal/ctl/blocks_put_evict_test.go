package ctl

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/pegaflow/pegad/internal/config"
	"github.com/pegaflow/pegad/internal/testutil/cluster"
)

// TestBlocksPutSaysWhenItEvicted (issue 33, item 7, the holder's side):
// puts into a pool too small for them all printed "stored" while each one
// past the pool's size evicted earlier blocks, so a peer asking later
// found them gone. A put that made the pool evict now says how many, in
// JSON (evicted_blocks) and in the table.
func TestBlocksPutSaysWhenItEvicted(t *testing.T) {
	d := cluster.Start(t, cluster.Named("put-evict"), cluster.WithConfig(func(c *config.Config) {
		c.MetricsListen = ""
		c.PoolSize = 4 << 20 // room for a few 1 MiB blocks
	}))
	f, _ := writeRandom(t, t.TempDir(), "k", 1<<20, 7)
	put := func(i int, args ...string) ran {
		return run(t, nil, append([]string{"--socket", d.SocketPath()}, append(args,
			"blocks", "put", "--namespace", "ns", "--hash", fmt.Sprintf("e0%02x", i), "--file", f)...)...)
	}
	evicting := 0
	for i := range 8 {
		before := d.Stats(t).GetEvictions()
		r := put(i, "-o", "json")
		evicted := d.Stats(t).GetEvictions() - before
		var res map[string]any
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res["created"] != true {
			t.Fatalf("put %d: code %d stdout %q stderr %q", i, r.code, r.stdout, r.stderr)
		}
		if got, ok := res["evicted_blocks"].(float64); !ok || uint64(got) != evicted {
			t.Errorf("put %d evicted %d blocks, printed evicted_blocks %v", i, evicted, res["evicted_blocks"])
		}
		if evicted > 0 {
			evicting++
		}
	}
	if evicting == 0 {
		t.Fatalf("8 MiB of puts into a 4 MiB pool evicted nothing")
	}
	before := d.Stats(t).GetEvictions()
	r := put(8)
	if n := d.Stats(t).GetEvictions() - before; r.code != 0 || n == 0 ||
		!strings.Contains(r.stdout, fmt.Sprintf("stored; pool full: %d block", n)) {
		t.Errorf("put into a full pool (%d evicted) printed %q (code %d), want it to say so", n, r.stdout, r.code)
	}
}
