package kubernetes

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// hashAlgo is the flag docs/engines.md says every vLLM engine sharing
// pegad's cache must pass: block hashes then agree across engines (CBOR,
// not pickle).
var hashAlgo = regexp.MustCompile(`--prefix-caching-hash-algo[= ]sha256_cbor\b`)

// vllmCommand matches a command line that starts a vLLM server.
var vllmCommand = regexp.MustCompile(`\bvllm serve\b|vllm\.entrypoints\.openai\.api_server`)

// logicalLines joins lines continued with a trailing backslash.
func logicalLines(text string) []string {
	var out []string
	cur := ""
	for _, l := range strings.Split(text, "\n") {
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		out = append(out, cur+l)
		cur = ""
	}
	if cur != "" {
		out = append(out, cur)
	}
	return out
}

// markdownCommands are the vLLM command lines in a Markdown file's fenced
// code blocks (prose that names `vllm serve` is no command).
func markdownCommands(text string) []string {
	var out []string
	var block []string
	in := false
	for _, l := range strings.Split(text, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			if in {
				for _, ll := range logicalLines(strings.Join(block, "\n")) {
					if vllmCommand.MatchString(ll) {
						out = append(out, ll)
					}
				}
				block = nil
			}
			in = !in
			continue
		}
		if in {
			block = append(block, l)
		}
	}
	return out
}

// scriptCommands are the vLLM command lines of a Dockerfile or shell
// script, comments left out.
func scriptCommands(text string) []string {
	var out []string
	for _, ll := range logicalLines(text) {
		if t := strings.TrimSpace(ll); !strings.HasPrefix(t, "#") && vllmCommand.MatchString(t) {
			out = append(out, t)
		}
	}
	return out
}

// yamlEngines are the vLLM containers of a YAML file: every object with
// an image and a command or args (a container in any workload, or in a
// Helm values file) whose image is vLLM's or whose command starts one;
// each returned as its command and args joined.
func yamlEngines(text string) ([]string, error) {
	var out []string
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			image, _ := x["image"].(string)
			var argv []string
			for _, k := range []string{"command", "args"} {
				if l, ok := x[k].([]any); ok {
					for _, a := range l {
						argv = append(argv, fmt.Sprint(a))
					}
				}
			}
			line := strings.Join(argv, " ")
			if image != "" && (strings.Contains(image, "vllm") || vllmCommand.MatchString(line)) {
				out = append(out, image+": "+line)
			}
			for _, e := range x {
				walk(e)
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	for _, doc := range splitDocs(text) {
		var v any
		if err := yaml.Unmarshal([]byte(doc), &v); err != nil {
			return nil, err
		}
		walk(v)
	}
	return out, nil
}

// engineCommands are the vLLM commands of one file, by its kind.
func engineCommands(name, text string) ([]string, error) {
	base := filepath.Base(name)
	switch {
	case strings.HasSuffix(name, ".md"):
		return markdownCommands(text), nil
	case strings.HasSuffix(name, ".yaml"), strings.HasSuffix(name, ".yml"):
		if strings.Contains(name, "/templates/") {
			// Helm templates are checked rendered (TestChart), and the
			// chart runs no engine.
			return scriptCommands(text), nil
		}
		return yamlEngines(text)
	case strings.HasSuffix(name, ".sh"), base == "Dockerfile", strings.HasSuffix(base, ".Dockerfile"):
		return scriptCommands(text), nil
	}
	return nil, nil
}

// missingHashAlgo returns the vLLM commands of one file that lack the flag.
func missingHashAlgo(name, text string) ([]string, int, error) {
	cmds, err := engineCommands(name, text)
	if err != nil {
		return nil, 0, err
	}
	var bad []string
	for _, c := range cmds {
		if !hashAlgo.MatchString(c) {
			bad = append(bad, c)
		}
	}
	return bad, len(cmds), nil
}

// TestVLLMCommandsSetHashAlgo: every vLLM command and engine container in
// deploy/ and docs/ passes --prefix-caching-hash-algo sha256_cbor, as
// docs/engines.md requires of every engine sharing the cache; and there
// is at least the Kubernetes example and the docs' `vllm serve`.
func TestVLLMCommandsSetHashAlgo(t *testing.T) {
	found := map[string]int{}
	eachDocFile(t, func(rel string, raw []byte) {
		bad, n, err := missingHashAlgo(rel, string(raw))
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			return
		}
		found[rel] = n
		for _, c := range bad {
			t.Errorf("%s: vLLM without --prefix-caching-hash-algo sha256_cbor (docs/engines.md, fleet settings): %s", rel, c)
		}
	})
	for _, f := range []string{"deploy/kubernetes/" + engineFile, "docs/engines.md"} {
		if found[f] == 0 {
			t.Errorf("no vLLM command found in %s: the check would pass on nothing", f)
		}
	}
}

// eachDocFile calls fn with every file under deploy/ and docs/, by its
// slash path from the repository root.
func eachDocFile(t *testing.T, fn func(rel string, b []byte)) {
	t.Helper()
	for _, dir := range []string{"deploy", "docs"} {
		err := filepath.WalkDir(filepath.Join(repoRoot, dir), func(p string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			rel, _ := filepath.Rel(repoRoot, p)
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			fn(filepath.ToSlash(rel), b)
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestHashAlgoCheckCanFail: the check finds a vLLM command without the
// flag in each kind of file, and accepts one with it in either form.
func TestHashAlgoCheckCanFail(t *testing.T) {
	cases := []struct {
		name, file, text string
		bad, total       int
	}{
		{"docs command without", "docs/x.md", "```sh\nPYTHONHASHSEED=0 vllm serve m \\\n  --kv-transfer-config '{}'\n```\n", 1, 1},
		{"docs command with", "docs/x.md", "```sh\nvllm serve m \\\n  --prefix-caching-hash-algo sha256_cbor\n```\n", 0, 1},
		{"docs prose", "docs/x.md", "Run `vllm serve` with the connector.\n", 0, 0},
		{"docs other algorithm", "docs/x.md", "```\nvllm serve m --prefix-caching-hash-algo sha256\n```\n", 1, 1},
		{"container without", "deploy/x.yaml", "spec:\n  containers:\n    - image: vllm/vllm-openai:v0.33.0\n      args: [--model=m]\n", 1, 1},
		{"container with, = form", "deploy/x.yaml", "spec:\n  containers:\n    - image: vllm/vllm-openai:v0.33.0\n      args: [--model=m, --prefix-caching-hash-algo=sha256_cbor]\n", 0, 1},
		{"container with, two args", "deploy/x.yaml", "containers:\n  - image: e\n    command: [vllm, serve]\n    args: [--prefix-caching-hash-algo, sha256_cbor]\n", 0, 1},
		{"shell in another image", "deploy/x.yaml", "containers:\n  - image: python:3\n    command: [sh, -c, 'vllm serve m']\n", 1, 1},
		{"not an engine", "deploy/x.yaml", "containers:\n  - image: ghcr.io/pegaflow/pegad:0.1.0\n    args: [serve]\n", 0, 0},
		{"Dockerfile CMD without", "deploy/image/x.Dockerfile", "FROM vllm/vllm-openai:v0.33.0\n# vllm serve in a comment\nCMD vllm serve m \\\n  --port 8000\n", 1, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad, n, err := missingHashAlgo(tc.file, tc.text)
			if err != nil {
				t.Fatal(err)
			}
			if len(bad) != tc.bad || n != tc.total {
				t.Fatalf("%d commands, %d without the flag (%q); want %d, %d", n, len(bad), bad, tc.total, tc.bad)
			}
		})
	}
}
