"""Namespaces and keys the engine connectors store KV blocks under.

It owns how a model's configuration becomes a namespace and how a
tensor-/pipeline-parallel rank's share gets its own namespace (docs/engines.md,
ENGINE_API's tensor-parallel design: ranks live in the namespace). It must
never talk to the daemon.

Two engines share blocks exactly when every factor that changes a block's
bytes is equal: the model, its dtype and cache dtype, the KV layout, block
size, layer/head shape and the TP/PP sizes. The namespace is a readable
model stem plus a digest of all of them, so changing any one of them can
never make an engine load another configuration's bytes.
"""

import hashlib
import json
import re

__all__ = ["model_namespace", "rank_namespace", "rank_namespaces", "hash_bytes", "MAX_NAMESPACE"]

MAX_NAMESPACE = 256
_STEM = re.compile(r"[^A-Za-z0-9._-]+")


def model_namespace(model, dtype, kv_layout, tp_size, pp_size, cache_dtype, block_size, **extra):
    """The base namespace of a model configuration: "<model stem>:<digest>".
    extra (e.g. num_layers, num_kv_heads, head_size, engine="vllm") joins
    the digest; every value must be JSON-able (str() otherwise)."""
    if int(tp_size) < 1 or int(pp_size) < 1:
        raise ValueError(f"tp_size {tp_size} and pp_size {pp_size} must be at least 1")
    factors = {"model": str(model), "dtype": str(dtype), "kv_layout": str(kv_layout), "tp_size": int(tp_size),
               "pp_size": int(pp_size), "cache_dtype": str(cache_dtype), "block_size": int(block_size)}
    for k, v in extra.items():
        factors[k] = v if isinstance(v, (int, float, bool, type(None))) else str(v)
    digest = hashlib.sha256(json.dumps(factors, sort_keys=True).encode()).hexdigest()[:16]
    stem = _STEM.sub("-", str(model).rstrip("/").rsplit("/", 1)[-1]).strip("-")[:64] or "model"
    return f"{stem}:{digest}"


def rank_namespace(base, tp_rank, pp_rank=0, cp_rank=None):
    """The namespace rank (tp_rank, pp_rank) stores its share under:
    base@tp<r> (pipeline stage 0) or base@pp<p>.tp<r>. tp_rank None: one
    share for every TP rank (an MLA latent), ".mla" in place of ".tp<r>".
    cp_rank (attention context parallel, each CP rank a slice of every
    block): ".cp<c>" before the TP part; None leaves it out."""
    if (tp_rank is not None and tp_rank < 0) or pp_rank < 0 or (cp_rank is not None and cp_rank < 0):
        raise ValueError(f"negative rank tp{tp_rank} pp{pp_rank} cp{cp_rank}")
    parts = [f"pp{pp_rank}"] if pp_rank else []
    if cp_rank is not None:
        parts.append(f"cp{cp_rank}")
    parts.append("mla" if tp_rank is None else f"tp{tp_rank}")
    ns = f"{base}@{'.'.join(parts)}"
    if len(ns.encode()) > MAX_NAMESPACE:
        raise ValueError(f"namespace of {len(ns.encode())} bytes (max {MAX_NAMESPACE})")
    return ns


def rank_namespaces(base, tp_size, pp_size=1):
    """Every rank's namespace: a scheduler's prefix is the minimum over these."""
    return [rank_namespace(base, t, p) for p in range(pp_size) for t in range(tp_size)]


def hash_bytes(h):
    """A block hash as the bytes pegad keys on: vLLM's BlockHash is bytes
    (older releases: a tuple whose hash_value is an int, taken as 32
    big-endian bytes, sign folded in);
    a str is its UTF-8 (an SGLang key longer than 64 bytes: its sha256)."""
    if hasattr(h, "hash_value"):  # vLLM before 0.10: BlockHash(hash_value, token_ids, extra_keys)
        h = h.hash_value
    if isinstance(h, (bytes, bytearray, memoryview)):
        b = bytes(h)
    elif isinstance(h, int):
        b = (h % (1 << 256)).to_bytes(32, "big")
    elif isinstance(h, str):
        b = bytes.fromhex(h) if _is_hex(h) else h.encode("utf-8")
    else:
        raise TypeError(f"block hash of type {type(h).__name__}")
    if not b:
        raise ValueError("empty block hash")
    return b if len(b) <= 64 else hashlib.sha256(b).digest()


def _is_hex(s):
    return len(s) % 2 == 0 and len(s) > 0 and all(c in "0123456789abcdefABCDEF" for c in s)
