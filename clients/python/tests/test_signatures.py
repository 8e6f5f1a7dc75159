"""The connectors against the engines' interfaces: every method a connector
defines that the engine's base class also defines takes the same
parameters (names, kinds, order) as upstream at the pinned commit
(tests/stubs/README.md), and no abstract method is left out."""

import inspect

import pytest


def _params(f):
    return [(p.name, p.kind) for p in inspect.signature(f).parameters.values()]


def _check(impl, base):
    checked = []
    for name, member in vars(base).items():
        if name.startswith("__") and name != "__init__":
            continue
        if not (inspect.isfunction(member) or isinstance(member, classmethod)):
            continue
        if name not in vars(impl):
            continue
        want = _params(getattr(base, name))
        got = _params(getattr(impl, name))
        assert [n for n, _ in got] == [n for n, _ in want], f"{impl.__name__}.{name}: {got} != upstream {want}"
        assert [k for _, k in got] == [k for _, k in want], f"{impl.__name__}.{name}: kinds differ from upstream"
        checked.append(name)
    assert not impl.__abstractmethods__, f"{impl.__name__} leaves abstract {sorted(impl.__abstractmethods__)}"
    return checked


def test_vllm_connector_matches_kvconnectorbase_v1():
    from vllm.distributed.kv_transfer.kv_connector.v1 import base
    from pegad import vllm as conn
    assert conn.UPSTREAM_COMMIT == getattr(base, "UPSTREAM_COMMIT", conn.UPSTREAM_COMMIT)
    checked = _check(conn.PegadConnector, base.KVConnectorBase_V1)
    for name in ("__init__", "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                 "request_finished", "register_kv_caches", "start_load_kv", "wait_for_layer_load",
                 "save_kv_layer", "wait_for_save", "get_finished", "get_block_ids_with_load_errors", "shutdown"):
        assert name in checked, f"PegadConnector does not implement {name}"


def test_vllm_connector_supports_hma_and_is_best_effort():
    from vllm.distributed.kv_transfer.kv_connector.v1 import base
    from pegad import vllm as conn
    assert base.supports_hma(conn.PegadConnector)
    _check(conn.PegadConnector, base.SupportsHMA)
    assert conn.PegadConnector.requires_piecewise_for_cudagraph({}) is False


def test_the_check_catches_a_wrong_signature():
    """A connector whose method drifts from upstream fails the check."""
    from vllm.distributed.kv_transfer.kv_connector.v1 import base
    from pegad import vllm as conn

    class Drifted(conn.PegadConnector):
        def wait_for_layer_load(self, layer):  # upstream: layer_name
            pass
    with pytest.raises(AssertionError, match="wait_for_layer_load"):
        _check(Drifted, base.KVConnectorBase_V1)


def test_sglang_backend_matches_hicachestorage():
    from sglang.srt.mem_cache import hicache_storage as base
    from pegad import sglang as backend
    assert backend.UPSTREAM_COMMIT == getattr(base, "UPSTREAM_COMMIT", backend.UPSTREAM_COMMIT)
    checked = _check(backend.PegadStorage, base.HiCacheStorage)
    for name in ("register_mem_pool_host", "batch_exists", "batch_get_v1", "batch_set_v1", "get", "batch_get",
                 "set", "batch_set", "exists"):
        assert name in checked, f"PegadStorage does not implement {name}"
