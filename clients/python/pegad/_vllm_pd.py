"""Prefill/decode disaggregation for pegad.vllm: the kv_transfer_params a
producer (prefill) engine hands back and a consumer (decode) engine acts on.

It owns the parameters' schema (vLLM's P/D proxy convention: the producer's
request_finished returns do_remote_prefill and remote_* keys, the proxy
copies them into the decode request), the producer's handoff (the blocks
pinned on its pegad for the consumer, Client.handoff) and the consumer's
check of what a request body names. It must never raise into vLLM: a
handoff that cannot be taken is "no parameters", parameters that do not
fit are refused (counted) and the request recomputes.

Why the consumer trusts nothing but the peer: kv_transfer_params come from
an HTTP request body. The consumer keys every pull by its OWN chained block
hashes (of the prompt it was given), so a body naming other hashes can only
shorten the prefix, never load another prompt's KV; the namespace must be
its own (model, dtype, layout, block size, TP); the peer is dialled with
known_peer_only (the daemon refuses a node that neither the cluster index
nor --peer-allow knows).
"""

import logging
import time
from dataclasses import dataclass

from . import _engine, errors, keys

log = logging.getLogger("pegad.vllm")

SCHEMA = 1  # "pegad" in the parameters: their version
# vLLM's finished states after which the producer hands its blocks off (an
# aborted request's blocks are not announced, as NixlConnector does).
FINISHED_OK = ("FINISHED_LENGTH_CAPPED", "FINISHED_STOPPED")


@dataclass
class RemotePull:
    """What a consumer's workers pull: from peer (host:port), each rank
    namespace's blocks with that namespace's handoff token."""
    peer: str
    tokens: dict  # rank namespace -> handoff token (str)
    timeout: float


def finished_ok(request):
    """Whether request ended as a prefill for a decode should (no status
    attribute: assume so)."""
    status = getattr(request, "status", None)
    if status is None:
        return True
    return getattr(status, "name", str(status)).rsplit(".", 1)[-1] in FINISHED_OK


def wants_decode(request):
    params = getattr(request, "kv_transfer_params", None) or {}
    return bool(params.get("do_remote_decode"))


def prompt_blocks(request, block_size):
    """Blocks of the request's prompt a consumer loads: every full block
    vLLM hashed (and the connector saved), the one holding the prompt's
    last token too. As with vLLM's NixlConnector, the consumer's load is
    asynchronous and the scheduler, once it is done, computes the last
    token again (num_computed_tokens one below the prompt's length:
    _update_waiting_for_remote_kv), so no more than it is recomputed."""
    prompt = getattr(request, "prompt_token_ids", None)
    n = len(prompt) if prompt is not None else request.num_tokens
    pub = getattr(request, "num_publishable_block_hashes", None)
    return max(0, min(len(request.block_hashes), n // block_size, pub if pub is not None else n))


def pull_limit(request, block_size):
    """The most blocks a consumer's P/D load covers: every full prompt
    block (prompt_blocks), since the load is asynchronous and vLLM's
    scheduler leaves the last token to compute after it."""
    return min(len(request.block_hashes), request.num_tokens // block_size)


def handoff(client, namespaces, hashes, ttl, wait):
    """Pin hashes on this node for a consumer, one handoff per rank
    namespace: (handoffs in namespaces' order, blocks covered), or
    (None, 0). The saves of the request's last step commit before its
    output reaches the scheduler (the worker waits for them, see
    _vllm_worker.Worker.save); should some not be visible yet (a save
    dropped, another rank late), it polls LOOKUP for up to wait seconds,
    then hands off the prefix every rank holds."""
    n = len(hashes)
    deadline = time.monotonic() + wait
    first = True  # the common case, everything committed: no LOOKUP before the pins
    while n > 0:
        if not first:
            held = _engine.prefix(client, namespaces, hashes[:n])
            if held < n and time.monotonic() < deadline:
                time.sleep(0.002)
                continue
            n = held
            if n == 0:
                break
        first = False
        taken = []
        try:
            for ns in namespaces:
                taken.append(client.handoff(ns, hashes[:n], ttl=ttl))
            return taken, n
        except errors.NotFound:  # evicted between the lookup and the pin: look again
            _release(taken)
            if time.monotonic() >= deadline:
                n -= 1
        except BaseException:
            _release(taken)
            raise
    return None, 0


def _release(handoffs):
    for h in handoffs:
        try:
            h.release()
        except _engine.FAILURES:
            pass


def producer_params(request, handoffs, base, hashes, block_size, tp, pp, mla, model):
    """The parameters request_finished returns for the consumer (JSON)."""
    peer = handoffs[0].peer_addr
    host, _, port = peer.rpartition(":")
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": handoffs[0].node_id,
        "remote_request_id": request.request_id,
        "remote_host": host,
        "remote_port": int(port) if port.isdigit() else port,
        "tp_size": tp,
        "pegad": SCHEMA,
        "remote_peer": peer,
        "remote_namespace": base,
        "remote_block_hashes": [h.hex() for h in hashes],
        "remote_num_tokens": len(hashes) * block_size,
        "remote_tp_size": tp,
        "remote_pp_size": pp,
        "remote_mla": bool(mla),
        "remote_model": str(model),
        "remote_handoffs": [h.token for h in handoffs],
        "remote_handoff_ttl": float(handoffs[0].ttl),
    }


class Refused(ValueError):
    """Parameters the consumer does not act on (the reason is the message)."""


def consumer_pull(params, request, base, namespaces, start, limit, timeout):
    """(blocks announced and equal to the request's own chain, up to
    limit, RemotePull) for parameters with do_remote_prefill and pegad's
    keys; None for parameters that are not a pegad P/D request. Raises
    Refused for ones that are, but do not fit this engine."""
    if not params or not params.get("do_remote_prefill") or params.get("pegad") is None:
        return None
    if params.get("pegad") != SCHEMA:
        raise Refused(f"parameters of schema {params.get('pegad')!r}, this connector speaks {SCHEMA}")
    peer = params.get("remote_peer")
    if not isinstance(peer, str) or not peer.rpartition(":")[2].isdigit():
        raise Refused(f"remote_peer {peer!r} is not host:port")
    if params.get("remote_namespace") != base:
        raise Refused(f"namespace {params.get('remote_namespace')!r} is not this engine's {base!r} (another "
                      f"model, dtype, layout, block size or TP size: {params.get('remote_tp_size')!r})")
    tokens = params.get("remote_handoffs")
    if not isinstance(tokens, list) or len(tokens) != len(namespaces) or \
            not all(isinstance(t, str) for t in tokens):
        raise Refused(f"remote_handoffs must be {len(namespaces)} tokens (one per rank namespace)")
    announced = params.get("remote_block_hashes")
    if not isinstance(announced, list):
        raise Refused("remote_block_hashes is not a list")
    n = 0
    own = request.block_hashes
    for i in range(min(len(announced), limit)):
        if announced[i] != keys.hash_bytes(own[i]).hex():
            break  # chained: the prompts differ from here on
        n = i + 1
    if n < min(len(announced), limit):
        log.warning("request %s: the producer's blocks match its prompt for %d of %d blocks",
                    request.request_id, n, len(announced))
    return max(0, n - start), RemotePull(peer, dict(zip(namespaces, tokens)), timeout)
