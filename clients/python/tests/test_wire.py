"""The wire decoders against malformed daemon answers (no daemon needed):
a ProtocolError, never an IndexError or struct.error."""

import socket
import struct
import threading

import pytest

import pegad
from pegad import _wire as wire

ALLOC_OK = b"\x00" + struct.pack("<QQQ", 7, 4096, 100)
LEASE_OK = b"\x00" + struct.pack("<QH", 9, 1) + struct.pack("<QQQQ", 0, 10, 10, 5)


@pytest.mark.parametrize("op,body,count", [
    (wire.OP_ALLOC, ALLOC_OK[:-1], 1),                      # truncated payload
    (wire.OP_ALLOC, ALLOC_OK + b"\x00", 1),                  # trailing byte
    (wire.OP_ALLOC, ALLOC_OK, 2),                            # fewer items than count
    (wire.OP_COMMIT, b"\x00\x02", 1),                        # created not 0/1
    (wire.OP_LEASE, LEASE_OK[:-8], 1),                       # slot table cut short
    (wire.OP_LEASE, b"\x00" + struct.pack("<QH", 9, 0), 1),  # zero slots
    (wire.OP_RELEASE, b"\x01" + struct.pack("<H", 2000) + b"x" * 2000, 1),  # message over the limit
    (wire.OP_RELEASE, b"\x01" + struct.pack("<H", 5) + b"abc", 1),          # message cut short
])
def test_malformed_results(op, body, count):
    with pytest.raises(pegad.ProtocolError):
        wire.decode_results(op, body, count)


def test_results_decode():
    assert wire.decode_results(wire.OP_ALLOC, ALLOC_OK, 1) == [(7, 4096, 100)]
    assert wire.decode_results(wire.OP_LEASE, LEASE_OK, 1) == [(9, [(0, 10, 10, 5)])]
    (err,) = wire.decode_results(wire.OP_LEASE, b"\x01" + struct.pack("<H", 4) + b"gone", 1)
    assert isinstance(err, pegad.NotFound) and "gone" in str(err)
    (err,) = wire.decode_results(wire.OP_ABORT, b"\x08\x00\x00", 1)
    assert isinstance(err, pegad.Unavailable)  # 8: closed (daemon shutting down)


def fake_daemon(path, reply):
    """A unix server that answers the HELLO with reply (no fd) and closes."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve():
        c, _ = srv.accept()
        with c:
            c.recv(64)
            c.sendall(reply)
        srv.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


@pytest.mark.parametrize("reply,exc", [
    (wire.HEADER.pack(8 + 20, wire.OP_HELLO, 0, 0, 1) + wire.HELLO_REPLY.pack(1, 1 << 20, 1000), pegad.ProtocolError),  # no memfd
    (wire.HEADER.pack(8 + 5, wire.OP_HELLO, 3, 0, 1) + b"nope!", pegad.ProtocolError),  # refused
    (wire.HEADER.pack(8 + 20, wire.OP_HELLO, 0, 0, 1) + wire.HELLO_REPLY.pack(wire.VERSION + 1, 1 << 20, 1000), pegad.ProtocolError),  # version
    (b"", pegad.Unavailable),  # closed at once
    (wire.HEADER.pack(1 << 30, wire.OP_HELLO, 0, 0, 1), pegad.ProtocolError),  # absurd length
])
def test_bad_hello(tmp_path, reply, exc):
    sock = str(tmp_path / "fake.sock")
    t = fake_daemon(sock + ".data", reply)
    with pytest.raises(exc):
        pegad.Client(sock, timeout=10)
    t.join(10)


# --- the client's limits against the Go side's constants ------------------

import ast  # noqa: E402
import glob  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
# "Name = expr", "Name int = expr" or "Name Op = expr" (a typed constant such
# as localwire's opcodes and statuses), with an optional trailing comment.
_CONST = re.compile(r"^\s*(?:const\s+)?([A-Z][A-Za-z0-9]*)\s*(?:[A-Za-z_][A-Za-z0-9_]*\s*)?=\s*([^/\n]+?)\s*(?://.*)?$")


def go_consts(pkg_dir, pkg, known=None):
    """The integer constants of a Go package's const declarations
    (non-test files), as {pkg.Name: value}; values may refer to names of
    this package or to known ones (other packages' constants)."""
    raw = {}
    for path in sorted(glob.glob(os.path.join(REPO, pkg_dir, "*.go"))):
        if path.endswith("_test.go"):
            continue
        in_block = False
        for line in open(path, encoding="utf-8"):
            s = line.strip()
            if s.startswith("const ("):
                in_block = True
                continue
            if in_block and s == ")":
                in_block = False
                continue
            if not (in_block or s.startswith("const ")):
                continue
            m = _CONST.match(line)
            if m:
                raw[m.group(1)] = m.group(2)
    out = dict(known or {})
    for _ in range(len(raw) + 1):
        for name, expr in raw.items():
            if f"{pkg}.{name}" in out:
                continue
            e = re.sub(r"\b([A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)?)\b",
                       lambda m: str(out.get(m.group(1), out.get(f"{pkg}.{m.group(1)}", m.group(1)))), expr)
            try:
                tree = ast.parse(e, mode="eval")
            except SyntaxError:
                continue
            if all(isinstance(n, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.LShift, ast.Mult,
                                  ast.Add, ast.Sub, ast.USub, ast.BitOr)) for n in ast.walk(tree)):
                v = eval(compile(tree, "<go const>", "eval"))
                if isinstance(v, int):
                    out[f"{pkg}.{name}"] = v
    return out


def test_go_const_parser():
    got = go_consts("api/limits", "limits")
    assert got["limits.MaxBlocksPerRequest"] > 0 and "limits.ErrInvalidKey" not in got
    wire_go = go_consts("api/localwire", "localwire", got)
    assert wire_go["localwire.MaxFrame"] > wire_go["localwire.MaxMessage"] > 0  # "16 << 20" evaluated
    assert wire_go["localwire.MaxBatch"] == got["limits.MaxBlocksPerRequest"]  # resolved across packages
    assert wire_go["localwire.OpHello"] == 1 and wire_go["localwire.StatusOK"] == 0  # typed constants


def test_wire_limits_match_the_go_constants():
    """pegad/_wire.py's and pegad/keys.py's limits are api/limits' and
    api/localwire's: a Go-side change that the client does not follow
    fails here."""
    from pegad import keys
    go = go_consts("api/limits", "limits")
    go = go_consts("api/localwire", "localwire", go)
    pairs = {
        "MAX_BATCH": "limits.MaxBlocksPerRequest",
        "MAX_NAMESPACE": "limits.MaxNamespaceLen",
        "MAX_HASH": "limits.MaxHashLen",
        "MAX_FRAME": "localwire.MaxFrame",
        "MAX_SLOTS": "localwire.MaxSlots",
        "MAX_MESSAGE": "localwire.MaxMessage",
        "MAX_TOKEN": "localwire.MaxToken",
        "MAX_NODE": "localwire.MaxNode",
        "NO_NODE": "localwire.NoNode",
        "MAX_PARTS": "localwire.MaxParts",
        "VERSION": "localwire.Version",
        "MIN_VERSION": "localwire.MinVersion",
        "HEADER_LEN": "localwire.HeaderLen",
    }
    for py, name in pairs.items():
        assert name in go, f"{name} not found in the Go sources under {REPO}/api"
        assert getattr(wire, py) == go[name], f"_wire.{py} = {getattr(wire, py)}, Go {name} = {go[name]}"
    assert go["localwire.MaxBatch"] == wire.MAX_BATCH and go["localwire.MaxNamespace"] == wire.MAX_NAMESPACE
    assert keys.MAX_NAMESPACE == go["limits.MaxNamespaceLen"]


def _go_name(prefix, py):
    """OP_LOOKUP_PIN -> OpLookupPin, ST_NO_LEASE -> StatusNoLease."""
    return prefix + "".join(w.capitalize() for w in py.split("_")[1:]).replace("Ok", "OK")


@pytest.mark.parametrize("py_prefix,go_prefix", [("OP_", "Op"), ("ST_", "Status")])
def test_wire_codes_match_the_go_constants(py_prefix, go_prefix):
    """Every opcode and status code of pegad/_wire.py is api/localwire's,
    both ways: a code renumbered, added or dropped on either side fails
    here, naming it."""
    go = go_consts("api/localwire", "localwire", go_consts("api/limits", "limits"))
    go_codes = {k.split(".", 1)[1]: v for k, v in go.items()
                if re.fullmatch(rf"localwire\.{go_prefix}[A-Z][A-Za-z]*", k)}
    py_codes = {_go_name(go_prefix, n): getattr(wire, n) for n in dir(wire)
                if n.startswith(py_prefix) and isinstance(getattr(wire, n), int)}
    assert len(go_codes) >= 10, go_codes  # the parser found the const blocks
    assert py_codes == go_codes, (f"only in _wire.py: {sorted(set(py_codes) - set(go_codes))}, "
                                  f"only in Go: {sorted(set(go_codes) - set(py_codes))}, differing: "
                                  f"{sorted(k for k in set(py_codes) & set(go_codes) if py_codes[k] != go_codes[k])}")
    if py_prefix == "OP_":
        assert set(wire.OP_NAMES) == set(go_codes.values())


POOL = 1 << 20


@pytest.mark.parametrize("parts,ok", [
    ([(0, 0, POOL // 2), (1, POOL // 2, POOL // 2)], True),
    ([(wire.NO_NODE, 0, POOL)], True),
    ([], False),
    ([(0, 0, POOL // 2), (1, POOL // 2 + 64, POOL // 2 - 64)], False),  # a gap
    ([(0, 0, POOL // 2)], False),  # short
    ([(0, 0, POOL // 2), (1, POOL // 2, POOL)], False),  # past the end
    ([(0, 0, 0), (1, 0, POOL)], False),  # an empty part
    ([(-2, 0, POOL)], False),
    ([(wire.MAX_NODE + 1, 0, POOL)], False),
])
def test_hello_reply_parts(parts, ok):
    """Version 4's HELLO reply lists the pool's NUMA parts, tiling the pool
    in order, as api/localwire checks them."""
    body = wire.hello_reply(4, POOL, 5000, parts)
    if not ok:
        with pytest.raises(pegad.ProtocolError):
            wire.decode_hello_reply(body)
        return
    assert wire.decode_hello_reply(body) == (4, POOL, 5000, tuple(parts))
    with pytest.raises(pegad.ProtocolError):
        wire.decode_hello_reply(body + b"\0")  # trailing bytes
    with pytest.raises(pegad.ProtocolError):
        wire.decode_hello_reply(body[:-1])  # truncated


def test_hello_reply_before_version_4_has_no_parts():
    body = wire.hello_reply(3, POOL, 5000, [(0, 0, POOL)])
    assert len(body) == 20 and wire.decode_hello_reply(body) == (3, POOL, 5000, ())


def test_hello_reply_decoder_fuzz():
    """Random bytes and mutations of valid replies: the decoder returns a
    reply that re-encodes to the same bytes, or raises ProtocolError;
    nothing else (the Python side of api/localwire's FuzzDecodeResults)."""
    import random
    rnd = random.Random(37)
    seeds = [wire.hello_reply(4, POOL, 1, [(0, 0, POOL // 2), (1, POOL // 2, POOL // 2)]),
             wire.hello_reply(3, POOL, 1)]
    for i in range(3000):
        b = bytearray(rnd.choice(seeds))
        for _ in range(rnd.randint(1, 4)):
            what = rnd.random()
            if what < 0.5 and b:
                b[rnd.randrange(len(b))] = rnd.randrange(256)
            elif what < 0.75:
                del b[rnd.randrange(len(b) + 1):]
            else:
                b += bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 24)))
        try:
            v, size, ms, parts = wire.decode_hello_reply(bytes(b))
        except pegad.ProtocolError:
            continue
        assert wire.hello_reply(v, size, ms, parts) == bytes(b), i
