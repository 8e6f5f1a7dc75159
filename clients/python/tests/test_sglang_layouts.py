"""pegad.sglang against SGLang's host pools, byte by byte: what each layout
stores (the module doc's table), interface_v1 at attach, the Ascend layout
refused by name, MLA stored once at TP 2, attention context parallel ranks
apart, and the v2 pool calls (KV served, hybrid pools refused)."""

import numpy as np
import pytest

import pegad
from test_sglang_engine import PAGE, HostPool, config, page_keys, storage

LAYOUTS = ["page_first", "layer_first", "page_first_direct", "page_head"]
MLA_LAYOUTS = ["page_first", "layer_first", "page_first_direct"]


def filled(layout, mla=False, seed=0, dtype=np.float16, **kw):
    p = HostPool(layout, mla=mla, dtype=dtype, **kw)
    p.kv_buffer[...] = np.random.default_rng(seed).standard_normal(p.kv_buffer.shape).astype(dtype)
    return p


def stored(sock, namespace, key):
    """The block's segments, as bytes, read straight from pegad."""
    with pegad.Client(sock) as c:
        with c.lease(namespace, bytes.fromhex(key)) as r:
            assert len(r.slots) == 1
            return [bytes(x) for x in r.slots[0] if x is not None]


def indices(starts):
    return np.array([s + j for s in starts for j in range(PAGE)])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_sglang_stored_bytes_per_layout(daemon, ns, layout):
    """fp16 pages stored K then V in the layout's page order, and read back
    into other slots of another pool byte-exact."""
    pool = filled(layout, seed=1)
    s, _ = storage(daemon.socket, layout, ns, pool=pool)
    ks = page_keys(list(range(100, 100 + 3 * PAGE)))
    starts = [8, 20, 4]
    assert s.batch_set_v1(ks, indices(starts)) == [True] * 3
    for k, st in zip(ks, starts):
        assert stored(daemon.socket, s.namespace, k) == [pool.expected_segment(0, st), pool.expected_segment(1, st)]
    b, pool_b = storage(daemon.socket, layout, ns, pool=HostPool(layout, dtype=np.float16))
    assert b.namespace == s.namespace
    other = [40, 12, 56]
    assert b.batch_get_v1(ks, indices(other)) == [True] * 3
    for st, ot in zip(starts, other):
        for kv in (0, 1):
            assert pool_b.expected_segment(kv, ot) == pool.expected_segment(kv, st)
    untouched = np.ones(pool_b.size, bool)
    untouched[indices(other)] = False
    for st in np.nonzero(untouched[::PAGE])[0] * PAGE:
        assert not any(pool_b.page(kv, li, st).any() for kv in (0, 1) for li in range(pool_b.layers))


def test_sglang_layouts_do_not_share_bytes(daemon, ns):
    a, _ = storage(daemon.socket, "page_first_direct", None, pool=filled("page_first_direct"), model_name=ns)
    b, _ = storage(daemon.socket, "page_head", None, pool=filled("page_head"), model_name=ns)
    assert a.namespace != b.namespace


def test_sglang_unaligned_page_start_is_refused(daemon, ns):
    s, _ = storage(daemon.socket, "page_first_direct", ns)
    with pytest.raises(ValueError, match="multiples of the page size"):
        s.batch_set_v1(page_keys(list(range(PAGE))), np.arange(2, 2 + PAGE))


def test_sglang_without_interface_v1_refuses_to_attach(daemon, ns):
    from pegad.sglang import PegadStorage
    with pytest.raises(ValueError, match="interface_v1"):
        PegadStorage(config(daemon.socket, ns, interface_v1=False), {})
    PegadStorage(config(daemon.socket, ns), {}).close()


def test_sglang_ascend_kv_split_layout_refused_by_name(daemon, ns):
    from pegad.sglang import PegadStorage
    s = PegadStorage(config(daemon.socket, ns, is_mla_model=True), {})
    pool = HostPool("page_first", mla=True)
    pool.layout = "page_first_kv_split"
    with pytest.raises(ValueError, match="page_first_kv_split.*Ascend"):
        s.register_mem_pool_host(pool)


def test_sglang_mla_page_head_refused(daemon, ns):
    from pegad.sglang import PegadStorage
    s = PegadStorage(config(daemon.socket, ns, is_mla_model=True), {})
    with pytest.raises(ValueError, match="MLA"):
        s.register_mem_pool_host(HostPool("page_head", mla=True))


@pytest.mark.parametrize("layout", MLA_LAYOUTS)
def test_sglang_mla_latent_stored_once_at_tp2(daemon, ns, layout):
    """TP 2: both ranks share one namespace (".mla"); rank 1 writes nothing,
    rank 0 stores each latent page once, and both ranks load it."""
    latent = 24  # kv_lora_rank + qk_rope_head_dim
    pools = [filled(layout, mla=True, seed=3, head_dim=latent), HostPool(layout, mla=True, dtype=np.float16,
                                                                        head_dim=latent)]
    r0, _ = storage(daemon.socket, layout, None, pool=pools[0], tp_size=2, tp_rank=0, is_mla_model=True,
                    model_name="mla-" + ns)
    r1, _ = storage(daemon.socket, layout, None, pool=pools[1], tp_size=2, tp_rank=1, is_mla_model=True,
                    model_name="mla-" + ns)
    assert r0.namespace == r1.namespace and r0.namespace.endswith("@mla")
    assert r0.saves and not r1.saves
    ks = page_keys(list(range(7, 7 + 2 * PAGE)))
    assert r1.batch_set_v1(ks, indices([0, 4])) == [True, True]
    assert r0.batch_exists(ks) == 0  # rank 1 stored nothing
    assert r0.batch_set_v1(ks, indices([8, 12])) == [True, True]
    assert r1.batch_exists(ks) == 2
    per_token = pools[0].layers * latent * 2  # fp16 latent of every layer: once, not once per rank
    for k, st in zip(ks, [8, 12]):
        segs = stored(daemon.socket, r0.namespace, k)
        assert segs == [pools[0].expected_segment(0, st)]
        assert len(segs[0]) == PAGE * per_token
    assert r1.batch_get_v1(ks, indices([32, 16])) == [True, True]
    for st, ot in zip([8, 12], [32, 16]):
        assert pools[1].expected_segment(0, ot) == pools[0].expected_segment(0, st)


def test_sglang_mla_attention_dp_groups_each_save(daemon, ns):
    """tp 4 as attention DP 2 x attention TP 2. SGLang's storage config then
    carries the attention-TP rank and size (tp_rank 0-1 of tp_size 2) beside
    dp_rank and dp_size: each DP group's first rank saves, the other not."""
    saves = []
    for dp in (0, 1):
        for r in (0, 1):
            s, _ = storage(daemon.socket, "page_first", None, pool=HostPool("page_first", mla=True), tp_size=2,
                           tp_rank=r, dp_rank=dp, dp_size=2, is_mla_model=True, model_name="mla-dp-" + ns)
            saves.append(s.saves)
            s.close()
    assert saves == [True, False, True, False]


def test_sglang_mla_cp_groups_each_save(daemon, ns):
    """tp 4 with attention CP 2 and no attention DP: the config's tp_rank is
    the global one, laid out (cp, tp): ranks 0 and 2 (each CP rank's first
    attention-TP rank) save."""
    saves = []
    for r in range(4):
        s, _ = storage(daemon.socket, "page_first", None, pool=HostPool("page_first", mla=True), tp_size=4,
                       tp_rank=r, attn_cp_size=2, attn_cp_rank=r // 2, is_mla_model=True, model_name="mla-cp-" + ns)
        saves.append(s.saves)
        s.close()
    assert saves == [True, False, True, False]


@pytest.mark.parametrize("mla", [False, True])
def test_sglang_attention_cp_ranks_keep_their_slices(daemon, ns, mla):
    """attn_cp_size 2: the CP rank is in the namespace; each rank stores and
    reads back its own slice of the same pages."""
    ranks = []
    for cp in (0, 1):
        pool = filled("page_first", mla=mla, seed=10 + cp)
        s, _ = storage(daemon.socket, "page_first", None, pool=pool, attn_cp_size=2, attn_cp_rank=cp,
                       tp_size=2, tp_rank=cp, is_mla_model=mla, model_name="cp-" + ns)
        ranks.append((s, pool))
    assert ranks[0][0].namespace != ranks[1][0].namespace
    assert "@cp0." in ranks[0][0].namespace and "@cp1." in ranks[1][0].namespace
    ks = page_keys(list(range(50, 50 + PAGE)))
    for s, _ in ranks:
        assert s.saves
        assert s.batch_set_v1(ks, indices([4])) == [True]
    for s, pool in ranks:
        back = HostPool("page_first", mla=mla, dtype=np.float16)
        s.register_mem_pool_host(back)
        assert s.batch_get_v1(ks, indices([20])) == [True]
        assert back.expected_segment(0, 20) == pool.expected_segment(0, 4)
    assert ranks[0][1].expected_segment(0, 4) != ranks[1][1].expected_segment(0, 4)


def test_sglang_v2_kv_pool_round_trip(daemon, ns):
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
    from pegad.sglang import PegadStorage
    pool = filled("page_first")
    s = PegadStorage(config(daemon.socket, ns), {})
    s.register_mem_host_pool_v2(pool, PoolName.KV)
    ks = page_keys(list(range(200, 200 + 2 * PAGE)))
    assert s.batch_set_v2([PoolTransfer(PoolName.KV, host_indices=indices([0, 8]), keys=ks)]) == \
        {PoolName.KV: [True, True]}
    res = s.batch_exists_v2(ks, [])
    assert res.kv_hit_pages == 2 and res.extra_pool_hit_pages == {}
    back = HostPool("page_first", dtype=np.float16)
    s.register_mem_host_pool_v2(back, PoolName.KV)
    assert s.batch_get_v2([PoolTransfer(PoolName.KV, host_indices=indices([16, 24]), keys=ks)]) == \
        {PoolName.KV: [True, True]}
    assert back.expected_segment(1, 24) == pool.expected_segment(1, 8)


@pytest.mark.parametrize("name", ["MAMBA", "SWA", "INDEXER", "DRAFT"])
def test_sglang_v2_hybrid_pools_refused_at_configuration(daemon, ns, name):
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer
    from pegad.sglang import PegadStorage
    s = PegadStorage(config(daemon.socket, ns), {})
    s.register_mem_host_pool_v2(HostPool("page_first"), PoolName.KV)
    with pytest.raises(ValueError, match=str(getattr(PoolName, name))):
        s.register_mem_host_pool_v2(HostPool("page_first"), getattr(PoolName, name))
    with pytest.raises(ValueError, match="KV pool only"):
        s.batch_set_v2([PoolTransfer(getattr(PoolName, name), host_indices=indices([0]), keys=["ab"])])


def test_rank_namespace_shared_and_cp_forms():
    from pegad import keys
    assert keys.rank_namespace("m:1", 1) == "m:1@tp1"  # unchanged forms
    assert keys.rank_namespace("m:1", 0, 2) == "m:1@pp2.tp0"
    assert keys.rank_namespace("m:1", None) == "m:1@mla"
    assert keys.rank_namespace("m:1", 3, 1, 2) == "m:1@pp1.cp2.tp3"
    assert keys.rank_namespace("m:1", None, 0, 0) == "m:1@cp0.mla"
    with pytest.raises(ValueError):
        keys.rank_namespace("m:1", 0, 0, -1)
