"""pegad.vllm in the tiny engine re-done in torch, in vLLM's layouts and
cache dtypes (tinyengine.KV): A saves, B loads from another block table
and must match a full recompute in the same layout and dtype, and must not
when K and V are swapped in the stored blocks. MLA at TP 2 stores one
latent (under TP rank 0's namespace) that both ranks load."""

import json

import numpy as np
import pytest

pytest.importorskip("torch")

import pegad  # noqa: E402
from pegad import keys  # noqa: E402
from test_vllm_engine import BS, max_diff, prompts, serve_pair  # noqa: E402
from tinyengine import LATENT, LAYERS, LAYOUTS, Engine, block_hashes  # noqa: E402

# bf16 and fp16 caches round the K/V; A and the reference compute the same
# prefix in batches of other sizes, so a last-bit difference may round the
# other way. A wrong KV moves logits by ~1.
TOL = {"float32": 1e-4, "float16": 5e-3, "bfloat16": 5e-2}
CASES = [(layout, "bfloat16") for layout in sorted(LAYOUTS)] + [("nhd", "float16"), ("packed", "float16"),
                                                                   ("hnd", "float32")]


@pytest.mark.parametrize("layout,dtype", CASES)
def test_layout_loads_and_matches_full_recompute(daemon, ns, layout, dtype):
    got, gen, want, want_gen, events = serve_pair(daemon.socket, 31, extra={"namespace": ns},
                                                  kv={"layout": layout, "dtype": dtype})
    assert ("loaded", 5) in events and not any(e[0] == "load_errors" for e in events)
    assert min(got) == 5 * BS
    assert max_diff(got, want) < TOL[dtype]


@pytest.mark.parametrize("layout", ["hnd", "packed"])
def test_swapped_k_and_v_fail_in_torch_layouts(daemon, ns, layout):
    """The negative control: K and V swapped in every stored block."""
    kv = {"layout": layout, "dtype": "bfloat16"}
    prompt, longer = prompts(32)
    with Engine(daemon.socket, block_size=BS, extra={"namespace": ns}, kv=kv) as a:
        a.serve("a", prompt)
        a.worker_stats()
    rank_ns = keys.rank_namespace(ns, 0)
    with pegad.Client(daemon.socket) as c:
        for h in block_hashes(prompt, BS):
            buf = bytearray(c.lookup(rank_ns, [h]) and LAYERS * 2 * BS * 4 * 8 * 2)
            c.get(rank_ns, h, buf)
            arr = np.frombuffer(buf, np.uint8).reshape(LAYERS, 2, -1)[:, ::-1].copy()
            c.delete(rank_ns, h)
            assert c.put(rank_ns, h, arr)
    with Engine(daemon.socket, block_size=BS, extra={"namespace": ns}, block_order=list(range(63, -1, -1)),
                kv=kv) as b:
        got, _ = b.serve("b", longer)
        assert ("loaded", 5) in b.events
    with Engine(None, block_size=BS, kv=kv) as ref:
        want, _ = ref.serve("ref", longer)
    assert max_diff(got, want) > 20 * TOL["bfloat16"]


def _stored(daemon, namespace):
    """(blocks, bytes) the daemon holds under namespace (pegactl blocks list)."""
    out = json.loads(daemon.ctl("-o", "json", "blocks", "list", "--namespace", namespace).stdout)
    return len(out["blocks"]), sum(blk["bytes"] for blk in out["blocks"])


def test_mla_tp2_stores_one_latent(daemon, ns):
    """TP 2 MLA: rank 0 saves the latent once, under @tp0; both ranks load
    it. Stored bytes per token, as the daemon lists them: layers * latent *
    2 (bf16), against tp times that in the per-rank scheme (one copy per
    rank's namespace, as MHA stores its heads)."""
    kv = {"layout": "mla", "dtype": "bfloat16"}
    got, gen, want, want_gen, events = serve_pair(daemon.socket, 33, tp=2, extra={"namespace": ns}, kv=kv)
    assert ("loaded", 5) in events and not any(e[0] == "load_errors" for e in events)
    assert max_diff(got, want) < TOL["bfloat16"] and gen == want_gen
    prompt, _ = prompts(33)
    hs = block_hashes(prompt, BS)
    per_block = LAYERS * BS * LATENT * 2
    with pegad.Client(daemon.socket) as c:
        assert c.lookup(keys.rank_namespace(ns, 0), hs) == 5
        assert c.lookup(keys.rank_namespace(ns, 1), hs) == 0  # not stored once per rank
        assert c.get(keys.rank_namespace(ns, 0), hs[0], bytearray(per_block)) == per_block
    (n0, b0), (n1, b1) = (_stored(daemon, keys.rank_namespace(ns, r)) for r in (0, 1))
    assert n0 >= 5 and (n1, b1) == (0, 0)
    once, per_rank = b0 / (n0 * BS), 2 * LAYERS * LATENT * 2
    print(f"MLA at TP 2 ({LAYERS} layers, latent {LATENT}, bf16): {once:.0f} bytes stored per token, "
          f"per-rank scheme {per_rank}")
    assert once == LAYERS * LATENT * 2 == per_rank / 2
