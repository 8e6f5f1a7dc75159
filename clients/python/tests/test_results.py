"""The result types live in pegad.results: _grpc.py builds them without
importing client.py (no _grpc <-> client cycle), and every public name is
still importable from pegad and pegad.client, as the same object."""

import ast
import os

import pegad
from pegad import _grpc, client, results

NAMES = ["ClusterHit", "SlotSize", "Slot", "AllocRequest", "BlockStatus", "PrefetchBlock", "PrefetchResult"]


def _imports(mod):
    tree = ast.parse(open(mod.__file__, encoding="utf-8").read())
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom):
            out.add(("." * n.level) + (n.module or ""))
            out.update(("." * n.level) + a.name for a in n.names if not n.module)
        elif isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
    return out


def test_grpc_does_not_import_the_client():
    imp = _imports(_grpc)
    assert ".results" in imp
    assert not {".client", "pegad.client", ".client."} & imp, imp


def test_results_import_nothing_of_pegad():
    assert {i for i in _imports(results) if i.startswith(".") or i.startswith("pegad")} == set()


def test_public_names_unchanged():
    for name in NAMES:
        assert getattr(pegad, name) is getattr(client, name) is getattr(results, name), name
        assert name in pegad.__all__ and name in client.__all__ and name in results.__all__
    assert pegad.BlockStatus("fetched") == "FETCHED"
    assert os.path.basename(results.__file__) == "results.py"
