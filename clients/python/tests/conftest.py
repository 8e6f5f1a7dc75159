import os
import secrets
import shutil
import sys
import tempfile

import pytest

sys.path.insert(0, os.path.dirname(__file__))
import harness  # noqa: E402


@pytest.fixture(scope="session")
def bins():
    d = tempfile.mkdtemp(prefix="pegad-py-bin-")
    try:
        yield harness.build(d)
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon(bins):
    d = harness.Daemon(bins, "pytest")
    try:
        yield d
    finally:
        d.stop()


@pytest.fixture
def client(daemon):
    import pegad
    with pegad.Client(daemon.socket, timeout=60) as c:
        yield c


@pytest.fixture
def ns():
    """A namespace of this test alone: tests share one daemon."""
    return "t-" + secrets.token_hex(4)


def rand_hash():
    return secrets.token_bytes(16)


# vLLM and SGLang are not installable here: their interface stubs stand in,
# only when the real package is missing (tests/stubs/README.md).
STUBS = os.path.join(os.path.dirname(__file__), "stubs")
for _pkg in ("vllm", "sglang"):
    try:
        __import__(_pkg)
    except ImportError:
        if STUBS not in sys.path:
            sys.path.insert(0, STUBS)
