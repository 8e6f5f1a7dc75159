"""pegad.vllm under the orderings of vLLM's runner at the pinned commit
(tinyengine replays them), each on a cold cache that must fill:
- start_load_kv after the forward when a step has no synchronous loads
  (vLLM PR #53333): saves must not depend on it;
- full CUDA graphs: replay skips wait_for_layer_load and save_kv_layer;
- kv_load_failure_policy "fail" (vLLM's default): a failed load ends the
  request, so the prefix the lookup counted must still be there at the load.
"""

import pytest

import pegad
from pegad import keys
from harness import Daemon
from test_vllm_engine import BS, TOL, fill_pool, max_diff, prompts, serve_pair
from tinyengine import Engine, RequestFailed, block_hashes


def _stored(socket, ns, prompt):
    with pegad.Client(socket) as c:
        return c.lookup(keys.rank_namespace(ns, 0), block_hashes(prompt, BS))


def _fills_and_loads(socket, ns, seed, **engine):
    got, gen, want, want_gen, events = serve_pair(socket, seed, extra={"namespace": ns}, **engine)
    prompt, _ = prompts(seed)
    assert _stored(socket, ns, prompt) == 5, "the cold cache did not fill"
    assert ("loaded", 5) in events and ("async",) in events
    assert not any(e[0] == "load_errors" for e in events)
    assert max_diff(got, want) < TOL and gen == want_gen


def test_start_load_kv_after_the_forward(daemon, ns):
    """No step has synchronous loads, so the runner calls start_load_kv
    after the forward: A's saves still land, B's load still arrives."""
    _fills_and_loads(daemon.socket, ns, 21)


def test_full_cuda_graphs_skip_the_layer_hooks(daemon, ns):
    _fills_and_loads(daemon.socket, ns, 22, graphs="full")


def test_fail_policy_prefix_survives_eviction_after_the_lookup(bins, ns):
    """Under "fail" the lookup's answer is a promise: the pool is filled
    right after it, before any block is allocated, and still nothing B was
    promised is evicted, so no request fails."""
    d = Daemon(bins, "py-fail", pool_size="1MiB")
    try:
        def fill(engine):
            fill_pool(d.socket, ns)
        got, gen, want, want_gen, events = serve_pair(d.socket, 23, extra={"namespace": ns}, between=fill,
                                                      policy="fail")
        assert ("loaded", 5) in events and not any(e[0] == "load_errors" for e in events)
        assert max_diff(got, want) < TOL and gen == want_gen
        with Engine(d.socket, block_size=BS, extra={"namespace": ns}, policy="fail") as e:  # a cold cache fills
            prompt, _ = prompts(24)
            e.serve("c", prompt)
            e.worker_stats()
        assert _stored(d.socket, ns, prompt) == 5
    finally:
        d.stop()


def test_fail_policy_ends_the_request_when_the_daemon_stops(bins, ns):
    """What "fail" does: pegad stops after the lookup, the load fails, and
    vLLM ends the request (docs/engines.md asks for "recompute")."""
    d = Daemon(bins, "py-failstop")
    try:
        prompt, longer = prompts(25)
        with Engine(d.socket, block_size=BS, extra={"namespace": ns, "retry": 0.1}) as a:
            a.serve("a", prompt)
            a.worker_stats()
        with Engine(d.socket, block_size=BS, extra={"namespace": ns, "retry": 0.1}, policy="fail") as b:
            with pytest.raises(RequestFailed):
                b.serve("b", longer, between=lambda e: d.stop())
    finally:
        d.stop()
