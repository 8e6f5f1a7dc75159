"""pegad.vllm across two nodes: engine A saves on node A; engine B on node B
finds the prefix through the cluster index (a real redis-server), has its
pegad prefetch it (get_num_new_matched_tokens answers None meanwhile), loads
it and computes only the suffix; its logits match a full recompute."""

import json

from harness import Daemon, wait_until
from test_cluster import redis_url  # noqa: F401 (the fixture)
from test_vllm_engine import BS, TOL, max_diff, prompts
from tinyengine import Engine, block_hashes

from pegad import keys


def test_node_b_loads_node_a_prefix_through_the_index(bins, redis_url, ns):  # noqa: F811
    node_a = Daemon(bins, "py-node-a", extra=("--cluster-redis", redis_url))
    node_b = Daemon(bins, "py-node-b", extra=("--cluster-redis", redis_url))
    try:
        prompt, longer = prompts(11)
        extra = {"namespace": ns, "cluster": True}
        with Engine(node_a.socket, block_size=BS, extra=extra) as a:
            a.serve("a", prompt)
            a.worker_stats()
        hexes = [h.hex() for h in block_hashes(prompt, BS)]

        def indexed():
            out = node_b.ctl("-o", "json", "blocks", "where", "--namespace", keys.rank_namespace(ns, 0), *hexes,
                             check=False)
            if out.returncode != 0:
                return False
            return all(b["holders"] for b in json.loads(out.stdout)["blocks"])
        wait_until("node A's blocks in the cluster index", indexed, timeout=30)
        with Engine(node_b.socket, block_size=BS, extra=extra, block_order=list(range(63, -1, -1))) as b:
            got, gen = b.serve("b", longer)
            events = b.events
        with Engine(None, block_size=BS) as ref:
            want, want_gen = ref.serve("ref", longer)
        assert ("none",) in events  # asked again while node B prefetched
        assert ("loaded", 5) in events and not any(e[0] == "load_errors" for e in events)
        assert max_diff(got, want) < TOL and gen == want_gen
    finally:
        node_b.stop()
        node_a.stop()
