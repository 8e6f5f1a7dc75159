"""pegad.keys: namespaces differ when any factor of a block's bytes does,
ranks get their own, and engine hashes become pegad keys."""

from collections import namedtuple

import pytest

from pegad import keys

BASE = dict(model="meta-llama/Llama-3.1-8B", dtype="bfloat16", kv_layout="NHD", tp_size=2, pp_size=1,
            cache_dtype="auto", block_size=16)


def test_namespace_is_stable_and_readable():
    a = keys.model_namespace(**BASE, num_layers=32)
    assert a == keys.model_namespace(**BASE, num_layers=32)
    stem, digest = a.split(":")
    assert stem == "Llama-3.1-8B" and len(digest) == 16


@pytest.mark.parametrize("factor,value", [("model", "meta-llama/Llama-3.1-70B"), ("dtype", "float16"),
                                          ("kv_layout", "HND"), ("tp_size", 4), ("pp_size", 2),
                                          ("cache_dtype", "fp8"), ("block_size", 32)])
def test_every_factor_changes_the_namespace(factor, value):
    assert keys.model_namespace(**{**BASE, factor: value}) != keys.model_namespace(**BASE)


def test_extra_factors_change_the_namespace():
    assert keys.model_namespace(**BASE, num_kv_heads=8) != keys.model_namespace(**BASE, num_kv_heads=4)


def test_rank_namespaces():
    assert keys.rank_namespace("m:1", 1) == "m:1@tp1"
    assert keys.rank_namespace("m:1", 0, 2) == "m:1@pp2.tp0"
    assert keys.rank_namespaces("m:1", 2, 2) == ["m:1@tp0", "m:1@tp1", "m:1@pp1.tp0", "m:1@pp1.tp1"]
    with pytest.raises(ValueError):
        keys.rank_namespace("x" * 256, 0)
    with pytest.raises(ValueError):
        keys.model_namespace(**{**BASE, "tp_size": 0})


def test_hash_bytes():
    assert keys.hash_bytes(b"\x01\x02") == b"\x01\x02"
    assert keys.hash_bytes("ab" * 32) == bytes.fromhex("ab" * 32)  # SGLang's hex page keys
    assert keys.hash_bytes(-1) == b"\xff" * 32  # vLLM's old int hashes, sign folded
    old = namedtuple("BlockHash", ["hash_value", "token_ids", "extra_keys"])
    assert keys.hash_bytes(old(5, (1, 2), None)) == (5).to_bytes(32, "big")
    assert len(keys.hash_bytes(b"x" * 100)) == 32  # longer than a pegad key: its sha256
    with pytest.raises(ValueError):
        keys.hash_bytes(b"")
