"""Prefill/decode disaggregation through pegad (issue 34): two real pegad
daemons on loopback (tcp) in one cluster index (a real redis-server), a
producer engine (kv_producer) on node P and a consumer engine
(kv_consumer) on node D, tinyengine loops in worker processes, and the toy
proxy of pd_proxy.py carrying kv_transfer_params over HTTP.

The consumer's logits must equal a single engine's run of the prompt, it
must compute no prompt token before the last partial block, and the K/V
swap negative control must break the match. Faults (the producer's pegad
killed or restarted after the handoff, a block gone on the producer, an
address the cluster does not know) end in a recompute with the load errors
reported, the same logits, and no lock, pin or handoff left on either node.
"""

import json
import random
import time

import numpy as np
import pytest

import pegad
from harness import Daemon, wait_until
from pd_proxy import EngineServer, Proxy, post
from test_cluster import free_port, redis_url  # noqa: F401 (the fixture)
from tinyengine import HEAD_DIM, HEADS, LAYERS, Engine

from pegad import keys

BS = 4
PROMPT_LEN = 22  # 5 full blocks and 2 tokens: the consumer computes positions 20 and 21 of the prompt
MAX_TOKENS = 3
TOL = 1e-4
FAULT_TTL = 3.0  # seconds: a fault test's handoff that no pull ends expires by then


@pytest.fixture(autouse=True)
def _needs_handoff():
    if not hasattr(pegad.Client, "handoff"):
        pytest.skip("the client has no handoff (issue 34, the daemon half)")


def prompt_of(seed, n=PROMPT_LEN):
    rng = random.Random(seed)
    return [rng.randrange(97) for _ in range(n)]


def node(bins, name, url, *extra):
    return Daemon(bins, name, extra=("--cluster-redis", url, *extra))


def wait_listed(consumer, producer):
    """Until the consumer's daemon sees the producer as a live node (the
    cluster index lags a start by its publish interval)."""
    def listed():
        out = consumer.ctl("-o", "json", "nodes", "list", check=False)
        return out.returncode == 0 and producer.listen in out.stdout.decode()
    wait_until("the producer in the cluster index", listed, timeout=30)


def assert_clean(d, timeout=20.0):
    """No holder session, fetch, handoff or pinned block left on d."""
    def clean():
        s = json.loads(d.ctl("-o", "json", "sessions", "list").stdout)
        if s.get("sessions") or s.get("fetches") or s.get("handoffs"):
            return False
        return d.stats().get("pinned_blocks", 0) == 0
    wait_until(f"nothing pinned on {d.socket}", clean, timeout=timeout)


def logits(answer):
    return {int(p): np.asarray(v, np.float32) for p, v in answer["logits"].items()}


def max_diff(got, ref):
    return max(float(np.abs(got[p] - ref[p]).max()) for p in got)


def run_pd(prod_socket, cons_socket, seed, tp_p=1, tp_d=1, kv=None, between=None, extra=None, n=PROMPT_LEN):
    """A prompt of n tokens through proxy -> producer -> consumer; then a
    single engine's run of it (TP tp_d). Returns a dict of what the test
    checks."""
    prompt = prompt_of(seed, n)
    extra = {"retry": 0.1, **(extra or {})}
    with Engine(prod_socket, tp=tp_p, block_size=BS, extra=extra, kv=kv, role="kv_producer") as pe, \
            Engine(cons_socket, tp=tp_d, block_size=BS, extra=extra, kv=kv, role="kv_consumer",
                   block_order=list(range(63, -1, -1))) as de:
        ps, ds = EngineServer(pe), EngineServer(de)
        proxy = Proxy(ps.url, ds.url, between)
        try:
            answer = post(proxy.url, {"prompt": prompt, "max_tokens": MAX_TOKENS})
        finally:
            proxy.close()
            ps.close()
            ds.close()
        assert not (proxy.errors or ps.errors or ds.errors), (proxy.errors, ps.errors, ds.errors)
        out = {"answer": answer, "params": proxy.prefill_answers[0]["kv_transfer_params"],
               "events": list(de.events), "prod": dict(pe.conn.stats), "cons": dict(de.conn.stats),
               "cons_workers": de.worker_stats(), "prod_workers": pe.worker_stats()}
    with Engine(None, tp=tp_d, block_size=BS, kv=kv) as ref:
        want, want_gen = ref.serve("ref", prompt, decode=MAX_TOKENS - 1)
    out["want"] = want
    out["want_tokens"] = want_gen + [int(np.argmax(want[max(want)]))]
    out["got"] = logits(answer)
    return out


def summed(workers, key):
    return sum(w.get(key, 0) for w in workers)


@pytest.fixture
def pd_nodes(bins, redis_url):  # noqa: F811
    p = node(bins, "pd-prefill", redis_url)
    d = node(bins, "pd-decode", redis_url)
    try:
        wait_listed(d, p)
        yield p, d
    finally:
        d.stop()
        p.stop()


def test_decode_pulls_the_prefill_and_matches_one_engine(pd_nodes):
    p, d = pd_nodes
    r = run_pd(p.socket, d.socket, 1)
    params = r["params"]
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_peer"] == p.listen and params["remote_engine_id"] == "pd-prefill"
    assert len(params["remote_block_hashes"]) == 5 and params["remote_num_tokens"] == 5 * BS
    assert r["prod"]["pd_handoffs"] == 1 and r["prod"]["pd_handoff_blocks"] == 5
    assert ("loaded", 5) in r["events"] and not any(e[0] == "load_errors" for e in r["events"])
    assert min(r["got"]) == 5 * BS  # nothing of the prompt before its last partial block was computed
    assert max_diff(r["got"], r["want"]) < TOL
    assert r["answer"]["choices"][0]["token_ids"] == r["want_tokens"]
    cw = r["cons_workers"]
    assert summed(cw, "pd_pulls") == 1 and summed(cw, "pd_pulled_blocks") == 5
    assert summed(cw, "loaded_blocks") == 5 and summed(cw, "saved_blocks") == 0  # a consumer saves nothing
    assert_clean(p)  # the pull ended the handoff
    assert_clean(d)


def test_prompt_of_whole_blocks_hands_off_what_the_decode_loads(pd_nodes):
    """A prompt of exactly 5 blocks: the producer hands off all 5, the
    decode loads them and computes only the last token again (vLLM's
    scheduler after an asynchronous load, as with NixlConnector), and the
    pull leaves nothing pinned."""
    p, d = pd_nodes
    r = run_pd(p.socket, d.socket, 10, n=5 * BS)
    assert len(r["params"]["remote_block_hashes"]) == 5
    assert ("loaded", 5) in r["events"] and min(r["got"]) == 5 * BS - 1
    assert max_diff(r["got"], r["want"]) < TOL
    assert_clean(p)
    assert_clean(d)


def metric(d, name):
    """The value of metric name (no labels) on d's /metrics."""
    import urllib.request
    addr = next(json.loads(line)["metrics"] for line in d.log().splitlines()
                if '"pegad ready"' in line)
    with urllib.request.urlopen(f"http://{addr}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not on {addr}")


def test_a_partial_pull_ends_the_whole_handoff(pd_nodes):
    """The decode's pegad holds blocks 0-1 already (another request of the
    same prefix): its pull fetches only blocks 2-4 from the producer, yet
    the producer's handoff of all 5 ends with that pull (end_handoff), long
    before its ttl: no handoff pending, no pin left there."""
    p, d = pd_nodes

    def copy_head(answer):
        params = answer["kv_transfer_params"]
        ns = keys.rank_namespace(params["remote_namespace"], 0)
        with pegad.Client(p.socket) as src, pegad.Client(d.socket) as dst:
            for hx in params["remote_block_hashes"][:2]:
                buf = bytearray(LAYERS * 2 * BS * HEADS * HEAD_DIM * 4)
                src.get(ns, bytes.fromhex(hx), buf)
                assert dst.put(ns, bytes.fromhex(hx), buf)
    r = run_pd(p.socket, d.socket, 12, between=copy_head, extra={"handoff_ttl": 120})
    assert ("loaded", 5) in r["events"] and not any(e[0] == "load_errors" for e in r["events"])
    assert max_diff(r["got"], r["want"]) < TOL
    cw = r["cons_workers"]
    assert summed(cw, "pd_pulls") == 1 and summed(cw, "pd_pulled_blocks") == 3  # 0-1 were local
    assert summed(cw, "pd_pulled_bytes") == 3 * LAYERS * 2 * BS * HEADS * HEAD_DIM * 4
    assert r["prod"]["pd_handoffs"] == 1 and r["prod"]["pd_handoff_blocks"] == 5
    assert_clean(p, timeout=10)  # the ttl is 120 s: only the consumer's end_handoff ends it this soon
    assert metric(p, "pegaflow_pd_handoffs_pending") == 0
    assert metric(p, "pegaflow_pd_handoff_age_seconds_count") == 1
    assert_clean(d)


def test_a_handoff_refused_is_counted_and_the_decode_recomputes(pd_nodes):
    """A handoff_ttl past the daemon's cap (300 s): the producer's pegad
    refuses the handoff, request_finished answers no parameters
    (pd_handoff_failed), and the decode recomputes the whole prompt."""
    p, d = pd_nodes
    r = run_pd(p.socket, d.socket, 13, extra={"handoff_ttl": 1000})
    assert r["prod"]["pd_handoff_failed"] == 1 and r["prod"]["pd_handoffs"] == 0
    assert not r["params"]
    assert min(r["got"]) == 0 and max_diff(r["got"], r["want"]) < TOL
    assert summed(r["cons_workers"], "pd_pulls") == 0
    assert_clean(p)
    assert_clean(d)


def test_negative_control_swapped_k_and_v_fails(pd_nodes):
    """K and V swapped in the producer's stored blocks between the hops:
    the consumer's logits must then differ (the match above can fail)."""
    p, d = pd_nodes
    half = BS * HEADS * HEAD_DIM * 4

    def swap(answer):
        params = answer["kv_transfer_params"]
        ns = keys.rank_namespace(params["remote_namespace"], 0)
        with pegad.Client(p.socket) as c:
            for hx in params["remote_block_hashes"]:
                h = bytes.fromhex(hx)
                buf = bytearray(LAYERS * 2 * half)
                c.get(ns, h, buf)
                arr = np.frombuffer(buf, np.uint8).reshape(LAYERS, 2, half)[:, ::-1].copy()
                c.delete(ns, h)
                assert c.put(ns, h, arr)
    r = run_pd(p.socket, d.socket, 2, between=swap, extra={"handoff_ttl": FAULT_TTL})
    assert ("loaded", 5) in r["events"]
    assert max_diff(r["got"], r["want"]) > 100 * TOL


def check_recomputed(r, first_bad):
    """A fault's outcome: load errors from block first_bad on, the
    consumer recomputed from there, and its answer is a single engine's."""
    errs = [e for e in r["events"] if e[0] == "load_errors"]
    assert errs, r["events"]
    assert min(r["got"]) == first_bad * BS
    assert max_diff(r["got"], r["want"]) < TOL
    assert r["answer"]["choices"][0]["token_ids"] == r["want_tokens"]
    assert summed(r["cons_workers"], "load_error_blocks") == 5 - first_bad


def test_producer_pegad_killed_after_the_handoff(pd_nodes):
    p, d = pd_nodes

    def kill(answer):
        p.proc.kill()
        p.proc.wait()
    r = run_pd(p.socket, d.socket, 3, between=kill)
    check_recomputed(r, 0)
    assert summed(r["cons_workers"], "pd_pull_failed") == 1
    assert_clean(d)


def test_block_gone_on_the_producer(pd_nodes):
    """Block 2 leaves the producer's index after the handoff (delete: an
    eviction that the pin cannot stop): blocks 0-1 load, 2-4 recompute."""
    p, d = pd_nodes

    def evict(answer):
        params = answer["kv_transfer_params"]
        with pegad.Client(p.socket) as c:
            ns = keys.rank_namespace(params["remote_namespace"], 0)
            c.delete(ns, bytes.fromhex(params["remote_block_hashes"][2]))
    r = run_pd(p.socket, d.socket, 4, between=evict, extra={"handoff_ttl": FAULT_TTL})
    check_recomputed(r, 2)
    assert_clean(p)  # the deleted block's pin ends at the handoff's ttl at the latest
    assert_clean(d)


def test_producer_pegad_restarted_after_the_handoff(bins, redis_url):  # noqa: F811
    """Same address, a new daemon with an empty pool: nothing to pull."""
    port = free_port()
    p = node(bins, "pd-prefill-r", redis_url, "--listen", f"127.0.0.1:{port}")
    d = node(bins, "pd-decode-r", redis_url)
    try:
        wait_listed(d, p)

        def restart(answer):
            p.restart()
            wait_listed(d, p)
        r = run_pd(p.socket, d.socket, 5, between=restart)
        check_recomputed(r, 0)
        assert_clean(p)
        assert_clean(d)
    finally:
        d.stop()
        p.stop()


def test_consumer_refuses_an_address_the_cluster_does_not_know(bins, redis_url, pd_nodes):  # noqa: F811
    """The parameters name a pegad outside the cluster index (holding the
    right blocks, even): the consumer's daemon refuses to dial it, the
    refusal is counted, and the request recomputes."""
    p, d = pd_nodes
    rogue = Daemon(bins, "pd-rogue")
    try:
        def redirect(answer):
            params = answer["kv_transfer_params"]
            ns = keys.rank_namespace(params["remote_namespace"], 0)
            with pegad.Client(p.socket) as src, pegad.Client(rogue.socket) as dst:
                for hx in params["remote_block_hashes"]:
                    buf = bytearray(LAYERS * 2 * BS * HEADS * HEAD_DIM * 4)
                    src.get(ns, bytes.fromhex(hx), buf)
                    dst.put(ns, bytes.fromhex(hx), buf)
            host, _, port = rogue.listen.rpartition(":")
            params.update(remote_peer=rogue.listen, remote_host=host, remote_port=int(port))
        r = run_pd(p.socket, d.socket, 6, between=redirect, extra={"handoff_ttl": FAULT_TTL})
        check_recomputed(r, 0)
        assert summed(r["cons_workers"], "pd_pull_refused") == 1
        assert summed(r["cons_workers"], "pd_pulled_blocks") == 0
        assert not json.loads(rogue.ctl("-o", "json", "sessions", "list").stdout).get("sessions")
        assert_clean(p)  # the unpulled handoff expired
        assert_clean(d)
    finally:
        rogue.stop()


TINY_BLOCK = LAYERS * 2 * BS * HEADS * HEAD_DIM * 4  # bytes of one tiny-engine block
IN_PARTS = {"pull_chunk_bytes": 2 * TINY_BLOCK}  # a pull of 5 blocks in prefetches of 2, 2 and 1


def test_a_pull_in_parts_loads_every_block_and_ends_the_handoff(pd_nodes):
    """The pull in parts (pull_chunk_bytes, each part's copy overlapping
    the next part's READ): the same logits, one pull counted, every block
    pulled once, and the last part's end_handoff ends the producer's
    handoff long before its ttl."""
    p, d = pd_nodes
    r = run_pd(p.socket, d.socket, 14, extra={**IN_PARTS, "handoff_ttl": 120})
    assert ("loaded", 5) in r["events"] and not any(e[0] == "load_errors" for e in r["events"])
    assert min(r["got"]) == 5 * BS and max_diff(r["got"], r["want"]) < TOL
    cw = r["cons_workers"]
    assert summed(cw, "pd_pulls") == 1 and summed(cw, "pd_pulled_blocks") == 5
    assert summed(cw, "pd_pulled_bytes") == 5 * TINY_BLOCK and summed(cw, "loaded_blocks") == 5
    assert_clean(p, timeout=10)  # the ttl is 120 s
    assert_clean(d)


def test_a_block_gone_mid_pull_in_parts_stops_it_and_ends_the_handoff(pd_nodes):
    """Block 2 (the second part's first) gone on the producer: blocks 0-1
    load, 2-4 recompute, and the handoff still ends at once (the third
    part, if already in flight, or one prefetch of the missing block with
    end_handoff), not at its ttl."""
    p, d = pd_nodes

    def evict(answer):
        params = answer["kv_transfer_params"]
        with pegad.Client(p.socket) as c:
            ns = keys.rank_namespace(params["remote_namespace"], 0)
            c.delete(ns, bytes.fromhex(params["remote_block_hashes"][2]))
    r = run_pd(p.socket, d.socket, 15, between=evict, extra={**IN_PARTS, "handoff_ttl": 120})
    check_recomputed(r, 2)
    cw = r["cons_workers"]
    # 0-1, 3 (part 2-3 reads what it finds), and 4 when the third part was in flight as part 2-3 was copied
    assert summed(cw, "pd_pulls") == 1 and summed(cw, "pd_pulled_blocks") in (3, 4)
    assert_clean(p, timeout=10)  # the ttl is 120 s: only the consumer's end ends it this soon
    assert_clean(d)


def test_a_pull_in_parts_from_a_killed_producer_tries_once(pd_nodes):
    """The producer's pegad killed after the handoff: the first part's
    prefetch fails, and no later part (nor an end of the handoff) is
    tried: one failure counted, everything recomputed."""
    p, d = pd_nodes

    def kill(answer):
        p.proc.kill()
        p.proc.wait()
    r = run_pd(p.socket, d.socket, 16, between=kill, extra=IN_PARTS)
    check_recomputed(r, 0)
    assert summed(r["cons_workers"], "pd_pull_failed") == 1
    assert_clean(d)


def test_tp2_to_tp2_rank_to_rank(pd_nodes):
    """Each consumer rank pulls its own rank's share with its own token."""
    p, d = pd_nodes
    r = run_pd(p.socket, d.socket, 7, tp_p=2, tp_d=2)
    assert len(r["params"]["remote_handoffs"]) == 2 and r["params"]["remote_tp_size"] == 2
    assert ("loaded", 5) in r["events"] and not any(e[0] == "load_errors" for e in r["events"])
    assert min(r["got"]) == 5 * BS and max_diff(r["got"], r["want"]) < TOL
    assert [w["pd_pulled_blocks"] for w in r["cons_workers"]] == [5, 5]
    assert_clean(p)
    assert_clean(d)


def test_mla_latent_tp1_to_tp2(pd_nodes):
    """MLA: the latent is stored once (TP rank 0's namespace, no TP size in
    it), so a TP 1 prefill serves a TP 2 decode whose ranks both read it."""
    pytest.importorskip("torch")
    p, d = pd_nodes
    r = run_pd(p.socket, d.socket, 8, tp_p=1, tp_d=2, kv={"layout": "mla"})
    assert len(r["params"]["remote_handoffs"]) == 1 and r["params"]["remote_mla"] is True
    assert ("loaded", 5) in r["events"] and not any(e[0] == "load_errors" for e in r["events"])
    assert min(r["got"]) == 5 * BS and max_diff(r["got"], r["want"]) < TOL
    assert [w["loaded_blocks"] for w in r["cons_workers"]] == [5, 5]
    assert_clean(p)
    assert_clean(d)


def test_tp1_to_tp2_heads_split_is_refused_and_recomputed(pd_nodes):
    """A TP 1 block holds every head; a TP 2 rank holds half of them, so
    the stored bytes differ (the namespace says so): the consumer refuses
    the parameters and recomputes, and the handoff expires unpulled."""
    p, d = pd_nodes
    r = run_pd(p.socket, d.socket, 9, tp_p=1, tp_d=2, extra={"handoff_ttl": FAULT_TTL})
    assert r["cons"]["pd_refused_params"] == 1
    assert min(r["got"]) == 0 and max_diff(r["got"], r["want"]) < TOL
    assert_clean(p)
    assert_clean(d)


def _params(hashes, **over):
    p = {"do_remote_prefill": True, "pegad": 1, "remote_peer": "127.0.0.1:5", "remote_namespace": "base",
         "remote_handoffs": ["t0"], "remote_block_hashes": [h.hex() for h in hashes]}
    p.update(over)
    return p


@pytest.mark.parametrize("over, want", [
    ({}, 5),
    ({"remote_block_hashes": "x"}, "not a list"),
    ({"pegad": 2}, "schema"),
    ({"remote_peer": "nohost"}, "host:port"),
    ({"remote_namespace": "other"}, "namespace"),
    ({"remote_handoffs": ["t0", "t1"]}, "tokens"),
    ({"swap": 2}, 2),  # the chain differs from block 2 on: only blocks 0-1 are the request's
    ({"do_remote_prefill": False}, None),
    ({"pegad": None}, None),  # another connector's parameters (NixlConnector's): not ours
], ids=["ok", "hashes", "schema", "peer", "namespace", "tokens", "other-prompt", "no-prefill", "not-pegad"])
def test_consumer_checks_the_parameters(over, want):
    """The body's parameters are checked before any pull: refused ones
    name why; hashes other than the request's own end the prefix."""
    from pegad import _vllm_pd
    from tinyengine import Request
    req = Request("r", prompt_of(11), BS)
    hashes = list(req.block_hashes)
    swap = over.pop("swap", None)
    if swap is not None:
        hashes[swap] = bytes(32)
    params = _params(hashes, **over)
    if isinstance(want, str):
        with pytest.raises(_vllm_pd.Refused, match=want):
            _vllm_pd.consumer_pull(params, req, "base", ["base@tp0"], 0, 5, 1.0)
        return
    out = _vllm_pd.consumer_pull(params, req, "base", ["base@tp0"], 0, 5, 1.0)
    if want is None:
        assert out is None
        return
    n, pull = out
    assert n == want and pull.peer == "127.0.0.1:5" and pull.tokens == {"base@tp0": "t0"}


def test_handoff_of_a_partly_saved_prompt_covers_the_prefix(daemon, ns):
    """Blocks 0-2 of 5 stored (a save of 3-4 dropped): the producer hands
    off the 3 after waiting at most its handoff_wait, and nothing beyond."""
    from pegad import _vllm_pd
    from conftest import rand_hash
    hashes = [rand_hash() for _ in range(5)]
    with pegad.Client(daemon.socket) as c:
        for h in hashes[:3]:
            c.put(ns, h, bytes(64))
        t = time.monotonic()
        taken, n = _vllm_pd.handoff(c, [ns], hashes, ttl=5.0, wait=0.2)
        assert n == 3 and len(taken) == 1 and taken[0].n == 3
        assert 0.2 <= time.monotonic() - t < 5
        assert taken[0].release() is True
        assert _vllm_pd.handoff(c, [ns], [rand_hash()], ttl=5.0, wait=0.0) == (None, 0)


def test_sglang_storage_across_nodes_needs_a_prefetch(pd_nodes, ns):
    """SGLang's side today (docs/engines.md, SGLang and P/D): PegadStorage
    on node D finds nothing of the pages node P's PegadStorage saved (it
    asks only its own pegad); a prefetch through the cluster index brings
    them to D, whose PegadStorage then serves them: the logits equal a
    recompute's."""
    from test_sglang_engine import PAGE as SG_PAGE
    from test_sglang_engine import forward, new_cache, page_keys, storage
    from test_vllm_engine import prompts
    from tinyengine import Model
    p, d = pd_nodes
    prompt, longer = prompts(21)
    model = Model()
    a, pool_a = storage(p.socket, "page_first", ns)
    dev_a, table_a = new_cache(), list(range(8))
    forward(model, prompt, 0, dev_a, table_a)
    ka = page_keys(prompt)
    starts_a = [8 + i * SG_PAGE for i in range(len(ka))]
    pool_a.backup(dev_a, table_a[:len(ka)], starts_a)
    assert a.batch_set_v1(ka, np.array([s + j for s in starts_a for j in range(SG_PAGE)])) == [True] * len(ka)
    b, pool_b = storage(d.socket, "page_first", ns)
    kb = page_keys(longer)[:(len(longer) - 1) // SG_PAGE]
    assert b.batch_exists(kb) == 0  # what is missing: no cluster lookup in PegadStorage
    with pegad.Client(d.socket, timeout=60) as c:
        def fetched():
            res = c.prefetch(b.namespace, [bytes.fromhex(k) for k in ka], timeout=20)
            return all(x.status in ("fetched", "already_local") for x in res.blocks)
        wait_until("P's pages through the cluster index", fetched, timeout=30)
    n = b.batch_exists(kb)
    assert n == len(ka)
    starts_b = [40 - i * SG_PAGE for i in range(n)]
    assert b.batch_get_v1(kb[:n], np.array([s + j for s in starts_b for j in range(SG_PAGE)])) == [True] * n
    dev_b, table_b = new_cache(), list(range(31, 23, -1))
    pool_b.load(dev_b, table_b[:n], starts_b)
    got = forward(model, longer, n * SG_PAGE, dev_b, table_b)
    want = forward(model, longer, 0, new_cache(), list(range(8)))[n * SG_PAGE:]
    a.close()
    b.close()
    assert float(np.abs(got - want).max()) < TOL
