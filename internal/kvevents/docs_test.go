package kvevents

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pegaflow/pegad/internal/store"
)

// docSubscriber returns the Python subscriber of docs/operations.md's "KV
// events" section.
func docSubscriber(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(raw)
	i := strings.Index(doc, "\n## KV events\n")
	if i < 0 {
		t.Fatal(`docs/operations.md has no "## KV events" section`)
	}
	sec := doc[i+1:]
	if j := strings.Index(sec, "\n## "); j >= 0 {
		sec = sec[:j]
	}
	_, code, ok := strings.Cut(sec, "```python\n")
	if !ok {
		t.Fatal("the KV events section has no python block")
	}
	code, _, _ = strings.Cut(code, "```")
	return code
}

// TestOperationsSubscriber runs docs/operations.md's subscriber against a
// live publisher: the lines it prints for a put, an eviction and a
// delete name the right sequence, kind, node, namespace, hash, llm-d key
// and medium.
func TestOperationsSubscriber(t *testing.T) {
	py := filepath.Join(t.TempDir(), "sub.py")
	if err := os.WriteFile(py, []byte(docSubscriber(t)), 0o644); err != nil {
		t.Fatal(err)
	}
	const kib = 1024
	r := newRig(t, 32*kib, Options{})
	cmd := exec.Command(python(t), py, "tcp://"+r.p.Addr(), "kv@")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("subscriber stderr:\n%s", stderr.String())
		}
	})
	r.waitSubscribers(t, 1)

	a, b, c := "\x01\x02sha256-of-block-a-0000000000", "short", "sha256-of-block-c-0000000000!!"
	// A connector's rank namespace: the topic names the model.
	const ns = "Llama-3.1-8B:0123456789abcdef@tp1"
	r.put(t, ns, a, 16*kib)
	r.put(t, ns, b, 16*kib)
	r.put(t, ns, c, 16*kib) // the pool holds two: evicts a
	if _, err := r.s.Delete(store.Key{Namespace: ns, Hash: b}); err != nil {
		t.Fatal(err)
	}
	key := func(h string) uint64 {
		p := []byte(h)
		if len(p) < 8 {
			p = append(make([]byte, 8-len(p)), p...)
		}
		return binary.BigEndian.Uint64(p[len(p)-8:])
	}
	want := []string{
		fmt.Sprintf("0 BlockStored node-a Llama-3.1-8B:0123456789abcdef %x %d cpu", a, key(a)),
		fmt.Sprintf("1 BlockStored node-a Llama-3.1-8B:0123456789abcdef %x %d cpu", b, key(b)),
		fmt.Sprintf("2 BlockRemoved node-a Llama-3.1-8B:0123456789abcdef %x %d cpu", a, key(a)),
		fmt.Sprintf("3 BlockStored node-a Llama-3.1-8B:0123456789abcdef %x %d cpu", c, key(c)),
		fmt.Sprintf("4 BlockRemoved node-a Llama-3.1-8B:0123456789abcdef %x %d cpu", b, key(b)),
	}
	lines := make(chan string, len(want))
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	for i, w := range want {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the subscriber exited after %d lines", i)
			}
			if l != w {
				t.Fatalf("line %d: %q\nwant    %q", i, l, w)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("line %d not printed in 10s", i)
		}
	}
}
