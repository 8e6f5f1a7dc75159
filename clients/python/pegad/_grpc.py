"""delete and prefetch over pegad's local gRPC API (api/pegad/v1/local.proto),
with gRPC status codes mapped to the package's exceptions. Imported on first
use, so the zero-copy paths never load grpc.
"""

import grpc

from . import errors
from .results import BlockStatus, PrefetchBlock, PrefetchResult
from .v1 import local_pb2, local_pb2_grpc

_CODES = {
    grpc.StatusCode.NOT_FOUND: errors.NotFound,
    grpc.StatusCode.RESOURCE_EXHAUSTED: errors.PoolFull,
    grpc.StatusCode.INVALID_ARGUMENT: errors.InvalidArgument,
    grpc.StatusCode.UNAVAILABLE: errors.Unavailable,
    grpc.StatusCode.ABORTED: errors.Aborted,
    grpc.StatusCode.INTERNAL: errors.InternalError,
    grpc.StatusCode.DEADLINE_EXCEEDED: errors.Unavailable,
    grpc.StatusCode.FAILED_PRECONDITION: errors.FailedPrecondition,
    grpc.StatusCode.PERMISSION_DENIED: errors.Denied,
}

_STATUS_PREFIX = "PREFETCH_BLOCK_STATUS_"


# The local gRPC channel's options, set deliberately (docs/engines.md,
# "The Python client's gRPC channel"):
MAX_MESSAGE = 16 << 20
"""Largest message either way. A PrefetchResponse of the most blocks one
Prefetch takes (4096) with a 1 KiB error each is about 6 MiB: grpcio's
default 4 MiB receive limit would fail the call after the daemon did the
work. 16 MiB, the data socket's frame limit, with room to spare."""

MAX_METADATA = 16 << 20
"""Largest header list (metadata) the client accepts, which it advertises as
HTTP/2 SETTINGS_MAX_HEADER_LIST_SIZE. A failed Prefetch's per-block
outcomes travel in the grpc-status-details-bin trailer (base64, growing
with the block count); past grpcio's 8 KiB default the server cannot send
it and the call ends with a bare RST_STREAM instead of its status."""

KEEPALIVE_TIME_MS = 6 * 60 * 1000
"""A ping after 6 minutes without activity on a call in flight, failing the
call when unanswered for KEEPALIVE_TIMEOUT_MS: only a wedged daemon needs
it (a stopped one closes the socket, which is seen at once). Not more
often, and no pings without a call: pegad's gRPC server (grpc-go's default
enforcement: at most one ping per 5 minutes, none without a call) answers
more with GOAWAY too_many_pings."""

KEEPALIVE_TIMEOUT_MS = 20 * 1000

RECONNECT_BACKOFF_MS = 100, 1000
"""Initial and longest wait between the channel's reconnect attempts
(grpcio's default grows to 120 s): a restarted daemon is found within a
second. The client also drops the channel after UNAVAILABLE, so the next
call dials at once."""

OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.max_metadata_size", MAX_METADATA),
    ("grpc.absolute_max_metadata_size", MAX_METADATA),  # newer grpcio's hard limit; older ones ignore it
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
    ("grpc.min_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[0]),
    ("grpc.max_reconnect_backoff_ms", RECONNECT_BACKOFF_MS[1]),
    # No retry policy (none is configured, and the socket's name resolution
    # brings none): gRPC only retries transparently a call that never
    # reached the daemon. Delete and Prefetch are never resent by the client.
    ("grpc.service_config_disable_resolution", 1),
)


def dial(socket):
    ch = grpc.insecure_channel("unix:" + socket, options=OPTIONS)
    return ch, local_pb2_grpc.LocalServiceStub(ch)


def _error(e):
    """The package's exception for a failed call (code kept as .code)."""
    cls = _CODES.get(e.code(), errors.PegadError)
    err = cls(f"{e.code().name}: {e.details()}")
    err.code = e.code()
    return err


def delete(stub, ns, h, timeout):
    try:
        return stub.DeleteBlock(local_pb2.DeleteBlockRequest(namespace=ns, hash=h), timeout=timeout).deferred
    except grpc.RpcError as e:
        raise _error(e) from None


def _result(pr):
    blocks = [PrefetchBlock(b.hash, BlockStatus(local_pb2.PrefetchBlockStatus.Name(b.status)
                                                .removeprefix(_STATUS_PREFIX).lower()), b.error, b.node)
              for b in pr.blocks]
    d = pr.duration.seconds + pr.duration.nanos / 1e9
    return PrefetchResult(blocks, pr.bytes, d, pr.session_id)


def prefetch(stub, ns, hashes, peer, server_timeout, timeout, handoff="", known_peer_only=False, end_handoff=False):
    # failure_in_response: a failed fetch answers OK with the failure and
    # every block's outcome in the response, not in a status trailer that
    # thousands of outcomes outgrow. An older daemon ignores it.
    req = local_pb2.PrefetchRequest(peer=peer, namespace=ns, hashes=hashes, failure_in_response=True,
                                    handoff_token=handoff, known_peer_only=known_peer_only,
                                    end_handoff=end_handoff)
    if server_timeout is not None:
        req.timeout.FromNanoseconds(int(server_timeout * 1e9))
    try:
        pr = stub.Prefetch(req, timeout=timeout)
    except grpc.RpcError as e:
        err = _error(e)
        err.result = _details(e)
        raise err from None
    if pr.HasField("error"):
        raise _failure(pr)
    return _result(pr)


def handoff(stub, ns, hashes, ttl, timeout):
    req = local_pb2.HandoffRequest(namespace=ns, hashes=hashes)
    req.ttl.FromNanoseconds(int(ttl * 1e9))
    try:
        return stub.Handoff(req, timeout=timeout)
    except grpc.RpcError as e:
        raise _error(e) from None


def release_handoff(stub, token, timeout):
    try:
        return stub.ReleaseHandoff(local_pb2.ReleaseHandoffRequest(token=token), timeout=timeout).released
    except grpc.RpcError as e:
        raise _error(e) from None


_BY_VALUE = {c.value[0]: c for c in grpc.StatusCode}


def _failure(pr):
    """The exception for a failed prefetch answered in the response: the
    one its status would have raised, with .result set."""
    code = _BY_VALUE.get(pr.error.code, grpc.StatusCode.UNKNOWN)
    cls = _CODES.get(code, errors.PegadError)
    err = cls(f"{code.name}: {pr.error.message}")
    err.code = code
    err.result = _result(pr)
    return err


def _details(e):
    """The PrefetchResponse among the status details, or None. The details
    are a google.rpc.Status in the trailer grpc-status-details-bin; it is
    decoded by hand (field 3: repeated Any) to need no googleapis package."""
    from google.protobuf import any_pb2
    raw = None
    for k, v in (e.trailing_metadata() or ()):
        if k == "grpc-status-details-bin":
            raw = v
    if not raw:
        return None
    for num, payload in _fields(raw):
        if num == 3:
            a = any_pb2.Any.FromString(payload)
            if a.Is(local_pb2.PrefetchResponse.DESCRIPTOR):
                pr = local_pb2.PrefetchResponse()
                a.Unpack(pr)
                return _result(pr)
    return None


def _varint(b, pos):
    v = shift = 0
    while True:
        c = b[pos]
        pos += 1
        v |= (c & 0x7F) << shift
        if c < 0x80:
            return v, pos
        shift += 7


def _fields(b):
    """(field number, bytes) of the length-delimited fields of a message."""
    pos = 0
    try:
        while pos < len(b):
            tag, pos = _varint(b, pos)
            wt = tag & 7
            if wt == 0:
                _, pos = _varint(b, pos)
            elif wt == 2:
                n, pos = _varint(b, pos)
                yield tag >> 3, b[pos:pos + n]
                pos += n
            elif wt == 1:
                pos += 8
            elif wt == 5:
                pos += 4
            else:
                return
    except IndexError:
        return
