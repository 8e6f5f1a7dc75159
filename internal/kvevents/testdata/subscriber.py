"""A KV-event subscriber that decodes as llm-d's kv-cache VLLMAdapter does
(pkg/kvevents/engineadapter/vllm_adapter.go): three frames (topic, 8-byte
big-endian sequence, msgpack payload); the payload an array [ts, events,
dp_rank?]; each event an array tagged by its class name; a bytes hash read
as its last 8 bytes, big endian. Debian's python3-zmq and python3-msgpack.

  subscriber.py sub ENDPOINT PREFIX     one JSON line per message
  subscriber.py replay ENDPOINT START   one JSON line per replayed message
"""
import json
import sys

import msgpack
import zmq


def hash64(raw):
    if isinstance(raw, int):
        return raw
    if isinstance(raw, bytes):
        if not raw:
            raise ValueError("empty hash")
        return int.from_bytes(raw[-8:].rjust(8, b"\0"), "big")
    raise TypeError("unsupported hash type %r" % type(raw))


def decode(payload):
    batch = msgpack.unpackb(payload, raw=False)
    if not isinstance(batch, list) or len(batch) < 2:
        raise ValueError("batch is not [ts, events, ...]: %r" % (batch,))
    ts, events = batch[0], batch[1]
    out = []
    for ev in events:
        tag = ev[0]
        if tag == "BlockStored":
            # [tag, block_hashes, parent, token_ids, block_size, lora_id?, medium?, lora_name?]
            hashes, parent, tokens, block_size = ev[1], ev[2], ev[3], ev[4]
            medium = ev[6] if len(ev) > 6 else None
            out.append({"tag": tag, "hashes": [hash64(h) for h in hashes],
                        "raw": [h.hex() for h in hashes], "parent": parent,
                        "tokens": tokens, "block_size": block_size, "medium": medium})
        elif tag == "BlockRemoved":
            medium = ev[2] if len(ev) > 2 else None
            out.append({"tag": tag, "hashes": [hash64(h) for h in ev[1]],
                        "raw": [h.hex() for h in ev[1]], "medium": medium})
        elif tag == "AllBlocksCleared":
            out.append({"tag": tag})
        else:
            raise ValueError("unknown vLLM event tag: %s" % tag)
    return float(ts), out


def sub(endpoint, prefix):
    ctx = zmq.Context()
    s = ctx.socket(zmq.SUB)
    s.connect(endpoint)
    s.setsockopt_string(zmq.SUBSCRIBE, prefix)
    print(json.dumps({"ready": True}), flush=True)
    while True:
        parts = s.recv_multipart()
        if len(parts) != 3:
            raise ValueError("expected 3 message parts, got %d" % len(parts))
        topic, seq, payload = parts
        if len(seq) != 8:
            raise ValueError("invalid sequence bytes length: %d" % len(seq))
        ts, events = decode(payload)
        print(json.dumps({"topic": topic.decode(), "seq": int.from_bytes(seq, "big"),
                          "ts": ts, "events": events}), flush=True)


def replay(endpoint, start):
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.RCVTIMEO, 10000)
    s.connect(endpoint)
    s.send_multipart([b"", int(start).to_bytes(8, "big")])
    while True:
        delim, seq, payload = s.recv_multipart()
        if seq == (-1).to_bytes(8, "big", signed=True):
            print(json.dumps({"end": True}), flush=True)
            return
        ts, events = decode(payload)
        print(json.dumps({"seq": int.from_bytes(seq, "big"), "events": events}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "sub":
        sub(sys.argv[2], sys.argv[3])
    else:
        replay(sys.argv[2], sys.argv[3])
