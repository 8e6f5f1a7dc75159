package localwire

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	items := []AllocItem{
		{Key: Key{Namespace: "ns", Hash: []byte{1, 2}}, Slots: []SlotSize{{K: 10, V: 5}, {K: 7}}},
		{Key: Key{Namespace: "other", Hash: []byte("h")}, Slots: []SlotSize{{K: 1 << 40}}},
	}
	var b []byte
	for _, it := range items {
		b = AppendAllocItem(b, it)
	}
	got, err := DecodeAllocItems(b, len(items))
	if err != nil || !reflect.DeepEqual(got, items) {
		t.Fatalf("alloc items %+v, %v", got, err)
	}
	keys, err := DecodeKeys(AppendKeyItem(AppendKeyItem(nil, items[0].Key), items[1].Key), 2)
	if err != nil || !reflect.DeepEqual(keys, []Key{items[0].Key, items[1].Key}) {
		t.Fatalf("keys %+v, %v", keys, err)
	}
	puts := []PutItem{
		{ID: 3, Key: items[0].Key, Slots: items[0].Slots, Next: 4096},
		{ID: 1 << 50, Key: items[1].Key, Slots: items[1].Slots},
	}
	b = nil
	for _, it := range puts {
		b = AppendPutItem(b, it)
	}
	if got, err := DecodePutItems(b, len(puts)); err != nil || !reflect.DeepEqual(got, puts) {
		t.Fatalf("put items %+v, %v", got, err)
	}
	tests := []struct {
		op  Op
		res []Result
	}{
		{OpAlloc, []Result{{Lease: 7, Seg: Segment{64, 100}}, {Status: StatusPoolFull, Msg: "no room"}}},
		{OpCommit, []Result{{Created: true}, {}, {Status: StatusNoLease, Msg: "gone"}}},
		{OpLease, []Result{{Lease: 3, Slots: []SlotPlace{{K: Segment{0, 8}, V: Segment{8, 8}}}}, {Status: StatusNotFound, Msg: "x"}}},
		{OpRelease, []Result{{}, {Status: StatusNoLease, Msg: "y"}}},
		{OpReserve, []Result{{Lease: 9, Seg: Segment{128, 4096}}, {Status: StatusPoolFull, Msg: "full"}}},
		{OpPut, []Result{{Created: true, Lease: 10, Seg: Segment{0, 4096}}, {Next: StatusPoolFull},
			{Created: true}, {Status: StatusInvalid, Msg: "size"}}},
		{OpLookup, []Result{{N: 4096}}},
		{OpLookupPin, []Result{{N: 3, Token: []byte("0123456789abcdef01234567")}}},
		{OpAdopt, []Result{{Adopted: []LeasePlace{{Lease: 1, Slots: []SlotPlace{{K: Segment{0, 8}}}},
			{Lease: 2, Slots: []SlotPlace{{K: Segment{8, 8}, V: Segment{16, 8}}, {K: Segment{24, 1}}}}}}}},
		{OpAdopt, []Result{{Status: StatusDenied, Msg: "another user's pin"}}},
		{OpUnpin, []Result{{}}},
		{OpLookupCluster, []Result{{Cluster: ClusterHit{Local: 1, N: 7, PeerID: "node-b", PeerAddr: "10.0.0.2:7000"}}}},
	}
	for _, tc := range tests {
		var b []byte
		for i := range tc.res {
			if tc.res[i].Status == StatusOK {
				b = AppendResult(b, tc.op, &tc.res[i])
			} else {
				b = AppendError(b, tc.res[i].Status, tc.res[i].Msg)
			}
		}
		got, err := DecodeResults(tc.op, b, len(tc.res))
		if err != nil {
			t.Fatalf("%v: %v", tc.op, err)
		}
		for i := range got {
			if got[i].Slots == nil && tc.res[i].Slots != nil || !reflect.DeepEqual(got[i], tc.res[i]) {
				t.Fatalf("%v result %d: %+v, want %+v", tc.op, i, got[i], tc.res[i])
			}
		}
	}
}

func TestChainAndToken(t *testing.T) {
	c := Chain{Namespace: "m@tp1", Hashes: [][]byte{{1}, {2, 3}, make([]byte, MaxHash)}}
	got, err := DecodeChain(AppendChain(nil, c), 1)
	if err != nil || !reflect.DeepEqual(got, c) {
		t.Fatalf("chain %+v, %v", got, err)
	}
	tok := []byte("token")
	if got, err := DecodeToken(AppendToken(nil, tok), 1); err != nil || !bytes.Equal(got, tok) {
		t.Fatalf("token %q, %v", got, err)
	}
	long := Chain{Namespace: "ns", Hashes: make([][]byte, MaxBatch+1)}
	bad := []struct {
		name  string
		body  []byte
		count int
		dec   func([]byte, int) error
	}{
		{"two chains", AppendChain(nil, c), 2, chainErr},
		{"too many hashes", AppendChain(nil, long), 1, chainErr},
		{"hash too long", AppendChain(nil, Chain{Namespace: "ns", Hashes: [][]byte{make([]byte, MaxHash+1)}}), 1, chainErr},
		{"truncated chain", AppendChain(nil, c)[:10], 1, chainErr},
		{"token too long", AppendToken(nil, make([]byte, MaxToken+1)), 1, tokenErr},
		{"trailing bytes", append(AppendToken(nil, tok), 0), 1, tokenErr},
	}
	for _, tc := range bad {
		if err := tc.dec(tc.body, tc.count); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", tc.name, err)
		}
	}
}

func chainErr(b []byte, n int) error { _, err := DecodeChain(b, n); return err }
func tokenErr(b []byte, n int) error { _, err := DecodeToken(b, n); return err }

func TestParseHeaderRejects(t *testing.T) {
	tests := []struct {
		name string
		b    []byte
	}{
		{"short", make([]byte, HeaderLen-1)},
		{"length below the header", Begin(nil, OpAlloc, 0, 0, 0)}, // length 0, not finished
		{"too many items", func() []byte { b, _ := Finish(Begin(nil, OpAlloc, 0, MaxBatch+1, 0)); return b }()},
		{"length over MaxFrame", []byte{0xff, 0xff, 0xff, 0x7f, 2, 0, 0, 0, 0, 0, 0, 0}},
	}
	for _, tc := range tests {
		if _, err := ParseHeader(tc.b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: %v, want ErrMalformed", tc.name, err)
		}
	}
}

// The fuzz targets feed untrusted bytes to every decoder the daemon and the
// client run on what comes off the socket: none may panic, and what decodes
// must encode back to the same bytes.

func FuzzParseHeader(f *testing.F) {
	b, _ := Finish(Begin(nil, OpLease, 0, 3, 9))
	f.Add(b)
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			return
		}
		if h.BodyLen() < 0 || h.BodyLen() > MaxFrame || h.Count > MaxBatch {
			t.Fatalf("accepted %+v", h)
		}
		re := Begin(nil, h.Op, h.Status, int(h.Count), h.Seq)
		re = append(re, make([]byte, h.BodyLen())...)
		re, err = Finish(re)
		if err != nil || !bytes.Equal(re[:HeaderLen], b[:HeaderLen]) {
			t.Fatalf("header %x re-encodes as %x (%v)", b[:HeaderLen], re[:HeaderLen], err)
		}
	})
}

func FuzzDecodeRequests(f *testing.F) {
	f.Add(uint8(OpAlloc), uint16(1), AppendAllocItem(nil, AllocItem{Key: Key{"ns", []byte{1}}, Slots: []SlotSize{{1, 2}}}))
	f.Add(uint8(OpLease), uint16(1), AppendKeyItem(nil, Key{"ns", []byte{1}}))
	f.Add(uint8(OpRelease), uint16(2), AppendID(AppendID(nil, 1), 2))
	f.Add(uint8(OpHello), uint16(0), AppendHello(nil, Hello{Version}))
	f.Add(uint8(OpPut), uint16(1), AppendPutItem(nil, PutItem{ID: 1, Key: Key{"ns", []byte{1}}, Slots: []SlotSize{{1, 2}}, Next: 3}))
	f.Add(uint8(OpLookup), uint16(1), AppendChain(nil, Chain{Namespace: "ns", Hashes: [][]byte{{1}, {2, 3}}}))
	f.Add(uint8(OpLookupCluster), uint16(1), AppendChain(nil, Chain{Namespace: "ns@tp0", Hashes: [][]byte{{9}}}))
	f.Add(uint8(OpAdopt), uint16(1), AppendToken(nil, []byte("0123456789abcdef01234567")))
	f.Add(uint8(OpAllocOn), uint16(2), AppendAllocOnItem(AppendAllocOnItem(nil, AllocOnItem{Node: 1, AllocItem: AllocItem{Key: Key{"ns", []byte{1}}, Slots: []SlotSize{{1, 2}}}}),
		AllocOnItem{Node: NoNode, AllocItem: AllocItem{Key: Key{"ns", []byte{2}}, Slots: []SlotSize{{3, 0}}}}))
	f.Fuzz(func(t *testing.T, op uint8, count uint16, body []byte) {
		n := int(count % (MaxBatch + 1))
		var re []byte
		switch Op(op) {
		case OpLookup, OpLookupPin, OpLookupCluster:
			c, err := DecodeChain(body, n)
			if err != nil {
				return
			}
			if len(c.Hashes) > MaxBatch || len(c.Namespace) > MaxNamespace {
				t.Fatalf("accepted a chain of %d hashes", len(c.Hashes))
			}
			re = AppendChain(nil, c)
		case OpAdopt, OpUnpin:
			tok, err := DecodeToken(body, n)
			if err != nil {
				return
			}
			re = AppendToken(nil, tok)
		case OpAlloc:
			items, err := DecodeAllocItems(body, n)
			if err != nil {
				return
			}
			for _, it := range items {
				if len(it.Slots) > MaxSlots || len(it.Namespace) > MaxNamespace || len(it.Hash) > MaxHash {
					t.Fatalf("accepted %+v", it)
				}
				re = AppendAllocItem(re, it)
			}
		case OpAllocOn:
			items, err := DecodeAllocOnItems(body, n)
			if err != nil {
				return
			}
			for _, it := range items {
				if len(it.Slots) > MaxSlots || len(it.Namespace) > MaxNamespace || len(it.Hash) > MaxHash {
					t.Fatalf("accepted %+v", it)
				}
				re = AppendAllocOnItem(re, it)
			}
		case OpPut:
			items, err := DecodePutItems(body, n)
			if err != nil {
				return
			}
			for _, it := range items {
				if len(it.Slots) > MaxSlots || len(it.Namespace) > MaxNamespace || len(it.Hash) > MaxHash {
					t.Fatalf("accepted %+v", it)
				}
				re = AppendPutItem(re, it)
			}
		case OpLease:
			keys, err := DecodeKeys(body, n)
			if err != nil {
				return
			}
			for _, k := range keys {
				re = AppendKeyItem(re, k)
			}
		case OpHello:
			h, err := DecodeHello(body)
			if err != nil {
				return
			}
			re = AppendHello(nil, h)
		default:
			ids, err := DecodeIDs(body, n)
			if err != nil {
				return
			}
			for _, id := range ids {
				re = AppendID(re, id)
			}
		}
		if !bytes.Equal(re, body) {
			t.Fatalf("op %d: %x re-encodes as %x", op, body, re)
		}
	})
}

func FuzzDecodeResults(f *testing.F) {
	f.Add(uint8(OpAlloc), uint16(1), AppendResult(nil, OpAlloc, &Result{Lease: 1, Seg: Segment{2, 3}}))
	f.Add(uint8(OpLease), uint16(1), AppendResult(nil, OpLease, &Result{Lease: 1, Slots: []SlotPlace{{K: Segment{0, 1}}}}))
	f.Add(uint8(OpCommit), uint16(2), AppendError(AppendResult(nil, OpCommit, &Result{Created: true}), StatusNoLease, "gone"))
	f.Add(uint8(OpHello), uint16(0), AppendHelloReply(nil, HelloReply{3, 1 << 20, 1000, nil}))
	f.Add(uint8(OpHello), uint16(0), AppendHelloReply(nil, HelloReply{Version, 1 << 20, 1000, []Part{{0, 0, 1 << 19}, {1, 1 << 19, 1 << 19}}}))
	f.Add(uint8(OpAllocOn), uint16(1), AppendResult(nil, OpAllocOn, &Result{Lease: 1, Seg: Segment{2, 3}}))
	f.Add(uint8(OpPut), uint16(2), AppendResult(AppendResult(nil, OpPut, &Result{Created: true, Lease: 2, Seg: Segment{0, 9}}), OpPut, &Result{Next: StatusPoolFull}))
	f.Add(uint8(OpLookup), uint16(1), AppendResult(nil, OpLookup, &Result{N: 12}))
	f.Add(uint8(OpLookupPin), uint16(1), AppendResult(nil, OpLookupPin, &Result{N: 2, Token: []byte("tok")}))
	f.Add(uint8(OpAdopt), uint16(1), AppendResult(nil, OpAdopt, &Result{Adopted: []LeasePlace{{Lease: 1, Slots: []SlotPlace{{K: Segment{0, 1}}}}}}))
	f.Add(uint8(OpUnpin), uint16(1), AppendError(nil, StatusNotFound, "no such pin"))
	f.Add(uint8(OpLookupCluster), uint16(1), AppendResult(nil, OpLookupCluster, &Result{Cluster: ClusterHit{Local: 1, N: 3, PeerID: "b", PeerAddr: "h:1"}}))
	f.Fuzz(func(t *testing.T, op uint8, count uint16, body []byte) {
		n := int(count % (MaxBatch + 1))
		if Op(op) == OpHello {
			h, err := DecodeHelloReply(body)
			if err != nil {
				return
			}
			if !bytes.Equal(AppendHelloReply(nil, h), body) {
				t.Fatalf("hello reply %x re-encodes differently", body)
			}
			var end uint64
			for _, p := range h.Parts {
				if p.Off != end || p.Len == 0 || p.Node < NoNode || p.Node > MaxNode {
					t.Fatalf("accepted part %+v after [0,%d)", p, end)
				}
				end += p.Len
			}
			if h.Version >= 4 && end != h.PoolSize {
				t.Fatalf("accepted parts covering %d of %d bytes", end, h.PoolSize)
			}
			return
		}
		res, err := DecodeResults(Op(op), body, n)
		if err != nil {
			return
		}
		var re []byte
		for i := range res {
			if res[i].Status == StatusOK {
				re = AppendResult(re, Op(op), &res[i])
			} else {
				re = AppendError(re, res[i].Status, res[i].Msg)
			}
		}
		if !bytes.Equal(re, body) {
			t.Fatalf("op %d: %x re-encodes as %x", op, body, re)
		}
	})
}
