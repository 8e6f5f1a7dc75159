package kvevents

import (
	"encoding/binary"
	"math"
	"strings"
	"time"

	"github.com/pegaflow/pegad/internal/store"
)

// The wire format is vLLM's (vllm/distributed/kv_events.py at commit
// b4e69e0af33f4698e157a262cc787fe61983cd3d, the array_like msgspec
// structs), which llm-d's kv-cache VLLMAdapter decodes
// (pkg/kvevents/engineadapter/vllm_adapter.go at llm-d/llm-d-kv-cache
// 0d2ae5460e64a5b53c725cb38fd6f6a411c06568):
//
//	message  = [topic, seq (8 bytes, big endian), payload]   (ZMQ multipart)
//	payload  = [ts float64, [event...]]                      (msgpack array)
//	event    = ["BlockStored", [hash...], parent, [token...], block_size, lora_id, medium]
//	         | ["BlockRemoved", [hash...], medium]
//	         | ["AllBlocksCleared"]
//
// A hash is the pegad key's hash bytes as msgpack bin (vLLM's
// ExternalBlockHash is bytes; llm-d reads its last 8 bytes big endian).

// Event tags, as vLLM's tagged msgspec structs name them.
const (
	TagBlockStored      = "BlockStored"
	TagBlockRemoved     = "BlockRemoved"
	TagAllBlocksCleared = "AllBlocksCleared"
)

// Medium is the value of the medium field of events of the pool's
// blocks: they live in pegad's host-memory pool.
const Medium = "cpu"

// MediumSSD is the medium of events of the SSD tier's copies
// (--ssd-path): BlockStored when a block's record is written, BlockRemoved
// when it ages out, fails its read or is deleted (store.Change.Lower).
const MediumSSD = "ssd"

func mediumOf(c store.Change) string {
	if c.Lower {
		return MediumSSD
	}
	return Medium
}

// DefaultTopic: llm-d parses "kv@<pod>@<model>" topics (exactly two
// '@') into a pod and a model name; the model part is the connectors'
// base namespace, which holds no '@'.
const DefaultTopic = "kv@{node}@{model}"

// Topic expands a topic template for one namespace: {node}, {namespace}
// (the whole namespace), {model} (the namespace before its first '@': the
// engine connectors store a tensor-parallel rank's share under
// "<base>@tp<r>", pegad.keys) and {rank} (what follows that '@', or "").
func Topic(template, node, namespace string) string {
	model, rank, _ := strings.Cut(namespace, "@")
	return strings.NewReplacer("{node}", node, "{namespace}", namespace, "{model}", model, "{rank}", rank).Replace(template)
}

// seqBytes is vLLM's sequence frame: 8 bytes, big endian.
func seqBytes(seq uint64) []byte {
	return binary.BigEndian.AppendUint64(nil, seq)
}

// endSeq marks the end of a replay (vLLM's END_SEQ: -1 as 8 bytes).
var endSeq = []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}

// encodeBatch encodes changes of one namespace as a KVEventBatch payload:
// consecutive changes of the same kind and medium share one event, so
// the events keep the store's order.
func encodeBatch(ts time.Time, changes []store.Change) []byte {
	type run struct {
		stored bool
		medium string
		hashes []string
	}
	var runs []run
	for _, c := range changes {
		st, med := c.Kind == store.Stored, mediumOf(c)
		if n := len(runs); n > 0 && runs[n-1].stored == st && runs[n-1].medium == med {
			runs[n-1].hashes = append(runs[n-1].hashes, c.Key.Hash)
			continue
		}
		runs = append(runs, run{stored: st, medium: med, hashes: []string{c.Key.Hash}})
	}
	b := appendArray(nil, 2)
	b = appendFloat64(b, float64(ts.UnixNano())/1e9)
	b = appendArray(b, len(runs))
	for _, r := range runs {
		if r.stored {
			b = appendArray(b, 7)
			b = appendStr(b, TagBlockStored)
			b = appendHashes(b, r.hashes)
			b = append(b, mpNil)  // parent_block_hash: pegad does not chain blocks
			b = appendArray(b, 0) // token_ids: pegad never sees tokens
			b = appendUint(b, 0)  // block_size in tokens: unknown to pegad
			b = append(b, mpNil)  // lora_id
			b = appendStr(b, r.medium)
			continue
		}
		b = appendArray(b, 3)
		b = appendStr(b, TagBlockRemoved)
		b = appendHashes(b, r.hashes)
		b = appendStr(b, r.medium)
	}
	return b
}

func appendHashes(b []byte, hashes []string) []byte {
	b = appendArray(b, len(hashes))
	for _, h := range hashes {
		b = appendBin(b, h)
	}
	return b
}

// A msgpack encoder of the few types the events use
// (github.com/msgpack/msgpack/blob/master/spec.md).
const mpNil = 0xc0

func appendArray(b []byte, n int) []byte {
	switch {
	case n < 16:
		return append(b, 0x90|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(b, 0xdc), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(b, 0xdd), uint32(n))
	}
}

func appendStr(b []byte, s string) []byte {
	switch n := len(s); {
	case n < 32:
		b = append(b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		b = append(b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xda), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xdb), uint32(n))
	}
	return append(b, s...)
}

func appendBin(b []byte, s string) []byte {
	switch n := len(s); {
	case n <= math.MaxUint8:
		b = append(b, 0xc4, byte(n))
	case n <= math.MaxUint16:
		b = binary.BigEndian.AppendUint16(append(b, 0xc5), uint16(n))
	default:
		b = binary.BigEndian.AppendUint32(append(b, 0xc6), uint32(n))
	}
	return append(b, s...)
}

func appendUint(b []byte, v uint64) []byte {
	if v < 128 {
		return append(b, byte(v))
	}
	return binary.BigEndian.AppendUint64(append(b, 0xcf), v)
}

func appendFloat64(b []byte, f float64) []byte {
	return binary.BigEndian.AppendUint64(append(b, 0xcb), math.Float64bits(f))
}
