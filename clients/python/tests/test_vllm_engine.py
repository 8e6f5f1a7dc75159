"""pegad.vllm in a real engine loop (tinyengine): engine A serves a prompt and
saves its KV through pegad; engine B, other processes with another block
table, serves the prompt plus a suffix, loads the prefix and computes only
the suffix. B's logits must equal a full recompute's, and must not when the
stored K and V are swapped (the negative control)."""

import random

import numpy as np
import pytest

import pegad
from pegad import keys
from harness import Daemon
from tinyengine import HEAD_DIM, HEADS, LAYERS, Engine, block_hashes

BS = 4
PROMPT_LEN = 22  # 5 full blocks and 2 tokens
SUFFIX_LEN = 7


def prompts(seed):
    rng = random.Random(seed)
    prompt = [rng.randrange(97) for _ in range(PROMPT_LEN)]
    return prompt, prompt + [rng.randrange(97) for _ in range(SUFFIX_LEN)]


def max_diff(got, ref):
    """Largest logit difference over the positions got computed."""
    return max(float(np.abs(got[p] - ref[p]).max()) for p in got)


TOL = 1e-4  # float32 sums in another order; a wrong KV moves logits by ~1


def fill_pool(socket, ns):
    """Puts three pools' worth of 8 KiB filler blocks under ns-filler: every
    block not pinned is evicted. Puts the pool refuses (what is left is
    pinned) are expected."""
    with pegad.Client(socket) as c:
        for i in range(3 * c.pool_size // 8192):
            try:
                c.put(ns + "-filler", i.to_bytes(8, "big"), bytes(8192))
            except pegad.PoolFull:
                pass  # the pinned prefix is what is left


def serve_pair(socket, seed, tp=1, extra=None, between=None, after_alloc=None, **engine):
    """A saves prompt; B serves prompt+suffix from another block table; the
    reference recomputes. Returns (B's logits, B's tokens, ref logits, ref
    tokens, B's events). engine: Engine's policy, graphs, kv."""
    prompt, longer = prompts(seed)
    with Engine(socket, tp=tp, block_size=BS, extra=extra, **engine) as a:
        a.serve("a", prompt)
        a.worker_stats()  # waits for A's saves to be committed
    with Engine(socket, tp=tp, block_size=BS, extra=extra, block_order=list(range(63, -1, -1)), **engine) as b:
        got, gen = b.serve("b", longer, between=between, after_alloc=after_alloc)
        events = b.events
    engine.pop("policy", None)
    engine.pop("graphs", None)
    with Engine(None, tp=tp, block_size=BS, **engine) as ref:
        want, want_gen = ref.serve("ref", longer)
    return got, gen, want, want_gen, events


def test_b_loads_the_prefix_and_matches_full_recompute(daemon, ns):
    got, gen, want, want_gen, events = serve_pair(daemon.socket, 1, extra={"namespace": ns})
    assert ("loaded", 5) in events  # 5 full blocks of the prompt
    assert min(got) == 5 * BS  # B computed only from the first position after the prefix
    assert max_diff(got, want) < TOL
    assert gen == want_gen


def test_negative_control_swapped_k_and_v_fails(daemon, ns):
    """Swapping K and V in the stored blocks must break the match: the test
    above can fail."""
    prompt, longer = prompts(2)
    with Engine(daemon.socket, block_size=BS, extra={"namespace": ns}) as a:
        a.serve("a", prompt)
        a.worker_stats()
    rank_ns = keys.rank_namespace(ns, 0)
    half = BS * HEADS * HEAD_DIM * 4
    with pegad.Client(daemon.socket) as c:
        for h in block_hashes(prompt, BS):
            buf = bytearray(LAYERS * 2 * half)
            c.get(rank_ns, h, buf)
            arr = np.frombuffer(buf, np.uint8).reshape(LAYERS, 2, half)[:, ::-1].copy()
            c.delete(rank_ns, h)
            assert c.put(rank_ns, h, arr)
    with Engine(daemon.socket, block_size=BS, extra={"namespace": ns}, block_order=list(range(63, -1, -1))) as b:
        got, _ = b.serve("b", longer)
        assert ("loaded", 5) in b.events
    with Engine(None, block_size=BS) as ref:
        want, _ = ref.serve("ref", longer)
    assert max_diff(got, want) > 100 * TOL


def test_namespace_derived_from_the_model_config(daemon):
    """Without a namespace override the blocks land under the namespace
    pegad.keys derives from the config (TP 1, rank 0), and a config that
    differs in one factor finds nothing."""
    prompt, _ = prompts(3)
    with Engine(daemon.socket, block_size=BS) as a:
        a.serve("a", prompt)
        a.worker_stats()
        base = a.conn.base
    assert base.startswith("numpy-decoder:")
    hs = block_hashes(prompt, BS)
    with pegad.Client(daemon.socket) as c:
        for h in hs:
            c.get(keys.rank_namespace(base, 0), h, bytearray(LAYERS * 2 * BS * HEADS * HEAD_DIM * 4))
    with Engine(daemon.socket, block_size=BS) as b:
        b.conn.namespaces = keys.rank_namespaces(keys.model_namespace(
            "tiny/numpy-decoder", "bfloat16", "NHD", 1, 1, "auto", BS), 1)
        n, _ = b.conn.get_num_new_matched_tokens(_req(prompt), 0)
        assert n == 0


def _req(tokens):
    from tinyengine import Request
    return Request("probe", list(tokens), BS)


def test_lookup_is_side_effect_free_and_capped(daemon, ns):
    """get_num_new_matched_tokens: same answer every call, never the last
    token, nothing pinned (an eviction-free delete works right after)."""
    prompt, longer = prompts(4)
    with Engine(daemon.socket, block_size=BS, extra={"namespace": ns}) as a:
        a.serve("a", prompt)
        a.worker_stats()
        sched = a.conn
        r = _req(longer)
        assert [sched.get_num_new_matched_tokens(r, 0) for _ in range(3)] == [(5 * BS, True)] * 3
        assert sched.get_num_new_matched_tokens(r, 2 * BS) == (3 * BS, True)
        exact = _req(prompt[:5 * BS])  # the whole prompt is cached: its last block is left to compute
        assert sched.get_num_new_matched_tokens(exact, 0) == (4 * BS, True)
    with pegad.Client(daemon.socket) as c:
        assert c.delete(keys.rank_namespace(ns, 0), block_hashes(prompt, BS)[0]) is False  # not pinned


def test_publishable_limit_is_honoured(daemon, ns):
    """Only the first num_publishable_block_hashes blocks are saved."""
    prompt, _ = prompts(5)
    with Engine(daemon.socket, block_size=BS, extra={"namespace": ns}) as a:
        from tinyengine import KVCacheBlocks, _sched_out
        r = _req(prompt)
        r.num_publishable_block_hashes = 2
        a.conn.update_state_after_alloc(r, KVCacheBlocks([0, 1, 2, 3, 4, 5]), 0)
        meta = a.conn.build_connector_meta(_sched_out(new=[("probe", prompt, [0, 1, 2, 3, 4, 5], 0)],
                                                      scheduled={"probe": PROMPT_LEN}))
        assert [len(s.hashes) for s in meta.saves] == [2]
        assert a.conn.request_finished(r, [0, 1, 2, 3, 4, 5]) == (False, None)


def test_tp2_two_worker_processes(daemon, ns):
    """TP 2: each rank saves its heads under its own namespace; the prefix is
    the minimum over ranks, and B's logits match a TP-2 recompute."""
    got, gen, want, want_gen, events = serve_pair(daemon.socket, 6, tp=2, extra={"namespace": ns})
    assert ("loaded", 5) in events
    assert max_diff(got, want) < TOL and gen == want_gen
    prompt, longer = prompts(6)
    hs = block_hashes(prompt, BS)
    with pegad.Client(daemon.socket) as c:
        half = LAYERS * 2 * BS * (HEADS // 2) * HEAD_DIM * 4
        for r in (0, 1):
            assert c.get(keys.rank_namespace(ns, r), hs[0], bytearray(half)) == half
        c.delete(keys.rank_namespace(ns, 1), hs[3])  # rank 1 lacks block 3: the prefix is 3 blocks
    with Engine(daemon.socket, tp=2, block_size=BS, extra={"namespace": ns}) as b:
        n, _ = b.conn.get_num_new_matched_tokens(_req(longer), 0)
        assert n == 3 * BS


def test_block_evicted_between_lookup_and_load_is_recomputed(bins, ns):
    """A small pool: A's blocks are evicted after B's lookup (before any
    pin); B's workers report them as load errors, the engine recomputes,
    logits match."""
    # lru: fillers put once must push out blocks that were looked up,
    # which adaptive's admission (the default) rightly keeps.
    d = Daemon(bins, "py-evict", pool_size="1MiB", extra=("--eviction", "lru"))
    try:
        prompt, _ = prompts(7)
        hs = block_hashes(prompt, BS)

        def evict(engine):
            with pegad.Client(d.socket) as c:
                for i in range(3 * c.pool_size // 8192):  # (looking would touch the block's LRU entry)
                    c.put(ns + "-filler", i.to_bytes(8, "big"), bytes(8192))
                assert _gone(c, keys.rank_namespace(ns, 0), hs[0]), "the prefix was not evicted"
        got, gen, want, want_gen, events = serve_pair(d.socket, 7, extra={"namespace": ns}, between=evict)
        assert ("loaded", 5) in events
        assert any(e[0] == "load_errors" for e in events)
        assert max_diff(got, want) < TOL and gen == want_gen
    finally:
        d.stop()


def _gone(c, namespace, h):
    try:
        c.get(namespace, h, bytearray(1 << 16))
        return False
    except pegad.NotFound:
        return True


def test_daemon_stopped_mid_run_engine_recomputes(bins, ns):
    """pegad stops after B's lookup: the loads fail, B recomputes and its
    logits still match; a later request with pegad gone is served too."""
    d = Daemon(bins, "py-stop")
    stopped = []
    try:
        def stop(engine):
            d.stop()
            stopped.append(True)
        got, gen, want, want_gen, events = serve_pair(d.socket, 8, extra={"namespace": ns, "retry": 0.1},
                                                      between=stop)
        assert stopped and ("loaded", 5) in events
        assert any(e[0] == "load_errors" for e in events)
        assert max_diff(got, want) < TOL and gen == want_gen
        prompt, longer = prompts(9)
        with Engine(d.socket, block_size=BS, extra={"namespace": ns, "retry": 0.1}) as e:
            got2, _ = e.serve("c", longer)
            assert ("loaded", 0) in e.events
            stats = e.worker_stats()[0]
            assert stats["saved_blocks"] == 0 and stats["save_dropped_blocks"] > 0
        with Engine(None, block_size=BS) as ref:
            want2, _ = ref.serve("ref", longer)
        assert max_diff(got2, want2) < TOL
    finally:
        d.stop()


def test_chunked_prefill_and_resume_after_preemption(daemon, ns):
    """Saves follow the scheduler: a chunk saves the blocks it fills; a
    request resumed after preemption (vLLM's resumed_req_ids: new_block_ids
    are all its blocks) saves into its new blocks from where it recomputes."""
    from tinyengine import KVCacheBlocks, _sched_out
    prompt, _ = prompts(12)
    with Engine(daemon.socket, block_size=BS, extra={"namespace": ns}) as a:
        r = _req(prompt)
        a.conn.update_state_after_alloc(r, KVCacheBlocks([0, 1, 2, 3, 4, 5]), 0)
        m = a.conn.build_connector_meta(_sched_out(new=[("probe", prompt, [0, 1, 2, 3, 4, 5], 0)],
                                                   scheduled={"probe": 9}))
        assert [s.block_ids for s in m.saves] == [[0, 1]]
        so = _sched_out(cached=[("probe", ([10, 11, 12, 13, 14, 15],), 0)], scheduled={"probe": PROMPT_LEN})
        so.scheduled_cached_reqs.resumed_req_ids = {"probe"}
        m = a.conn.build_connector_meta(so)
        assert [s.block_ids for s in m.saves] == [[10, 11, 12, 13, 14]]
        assert m.saves[0].hashes == block_hashes(prompt, BS)


def test_scheduler_pin_survives_eviction_before_the_load(bins, ns):
    """With the daemon's pinning lookup, update_state_after_alloc pins the
    prefix and the workers adopt it: filling the pool after the pin evicts
    nothing B needs, so B loads without errors and its logits match."""
    if not hasattr(pegad.Client, "lookup_pin"):
        pytest.skip("the client has no lookup_pin yet (issue 24 item 1, branch engine)")
    d = Daemon(bins, "py-pin", pool_size="1MiB")
    try:
        def fill(engine):
            fill_pool(d.socket, ns)
        got, gen, want, want_gen, events = serve_pair(d.socket, 13, extra={"namespace": ns}, after_alloc=fill)
        assert ("loaded", 5) in events
        assert not any(e[0] == "load_errors" for e in events)
        assert max_diff(got, want) < TOL and gen == want_gen
    finally:
        d.stop()
