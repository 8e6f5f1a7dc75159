"""pegad's Python result and value types: what the client's calls take
and answer (slots, alloc requests, lookup_cluster's ClusterHit, prefetch
outcomes). A module of their own, with no import of the client, so the
gRPC layer (_grpc.py) builds results without importing client.py; pegad
and pegad.client re-export every name.
"""

from collections import namedtuple

__all__ = ["ClusterHit", "SlotSize", "Slot", "AllocRequest", "BlockStatus", "PrefetchBlock", "PrefetchResult"]

ClusterHit = namedtuple("ClusterHit", ["peer", "n", "local", "peer_id"], defaults=[""])
ClusterHit.__doc__ = ("lookup_cluster's answer: local blocks of the chain are on this node; the node at peer (its "
                      "peer address; None: no other node holds the first block) holds the first n. When n > local, "
                      "prefetch(namespace, hashes[local:n], peer=peer) brings the rest here.")

SlotSize = namedtuple("SlotSize", ["k", "v"], defaults=[0])
SlotSize.__doc__ = "One slot (one tensor-parallel rank) of a block: K bytes and V bytes (0: no V segment)."

Slot = namedtuple("Slot", ["k", "v"])
Slot.__doc__ = "A leased slot: read-only memoryviews of its K and V segments (v None: no V segment)."

AllocRequest = namedtuple("AllocRequest", ["namespace", "hash", "size", "slots"], defaults=[None])
AllocRequest.__doc__ = "One block of alloc_batch: size bytes, or the shape given by slots."


class BlockStatus(str):
    """A block's prefetch status, lower-case as pegactl prints it: fetched, already_local,
    missing_on_peer, failed, discarded, not_found, not_fetched (the pool had no room beside what
    the prefetch kept). The upper-case names of 0.1.0 (FETCHED, ...)
    are deprecated aliases: they still compare equal (BlockStatus("fetched") == "FETCHED"),
    but as dict keys or set members only the lower-case names match."""

    __slots__ = ()

    def __eq__(self, other):
        if isinstance(other, str):
            return str.__eq__(self, other.lower())
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = str.__hash__


PrefetchBlock = namedtuple("PrefetchBlock", ["hash", "status", "error", "node"], defaults=[""])
PrefetchBlock.__doc__ = ("One block's prefetch outcome; status is a BlockStatus, lower-case as pegactl prints it "
                         "(fetched, already_local, missing_on_peer, failed, discarded, not_found); node: the node "
                         "that served it when no peer was given (cluster index).")

PrefetchResult = namedtuple("PrefetchResult", ["blocks", "bytes", "duration", "session_id"])
PrefetchResult.__doc__ = "What a prefetch did: per-block outcomes, bytes moved, seconds taken, session id."
