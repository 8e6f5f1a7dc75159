"""delete and prefetch over pegad's local gRPC API (api/pegad/v1/local.proto),
with gRPC status codes mapped to the package's exceptions. Imported on first
use, so the zero-copy paths never load grpc.
"""

import grpc

from . import errors
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
}

_STATUS_PREFIX = "PREFETCH_BLOCK_STATUS_"


def dial(socket):
    ch = grpc.insecure_channel("unix:" + socket)
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
    from .client import BlockStatus, PrefetchBlock, PrefetchResult
    blocks = [PrefetchBlock(b.hash, BlockStatus(local_pb2.PrefetchBlockStatus.Name(b.status)
                                                .removeprefix(_STATUS_PREFIX).lower()), b.error, b.node)
              for b in pr.blocks]
    d = pr.duration.seconds + pr.duration.nanos / 1e9
    return PrefetchResult(blocks, pr.bytes, d, pr.session_id)


def prefetch(stub, ns, hashes, peer, server_timeout, timeout):
    req = local_pb2.PrefetchRequest(peer=peer, namespace=ns, hashes=hashes)
    if server_timeout is not None:
        req.timeout.FromNanoseconds(int(server_timeout * 1e9))
    try:
        return _result(stub.Prefetch(req, timeout=timeout))
    except grpc.RpcError as e:
        err = _error(e)
        err.result = _details(e)
        raise err from None


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
