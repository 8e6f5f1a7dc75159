package kubernetes

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/linter"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	"github.com/moby/buildkit/frontend/dockerfile/shell"
	"github.com/moby/patternmatcher"
	"github.com/moby/patternmatcher/ignorefile"
	"sigs.k8s.io/yaml"
)

// The images (deploy/image), built from the repository root.
const (
	repoRoot         = "../.."
	pegadDockerfile  = "deploy/image/Dockerfile"
	engineDockerfile = "deploy/image/vllm.Dockerfile"
	stubBase         = "clients/python/tests/stubs/vllm/distributed/kv_transfer/kv_connector/v1/base.py"
)

// dockerfile is one Dockerfile as BuildKit reads it.
type dockerfile struct {
	path     string // relative to the repository root
	stages   []instructions.Stage
	metaArgs map[string]string // ARGs before the first FROM, with their defaults
	warnings []string          // BuildKit's parser and linter warnings
	ignore   *patternmatcher.PatternMatcher
}

// mapEnv is a shell.EnvGetter over a map.
type mapEnv map[string]string

func (m mapEnv) Get(k string) (string, bool) { v, ok := m[k]; return v, ok }
func (m mapEnv) Keys() []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	return keys
}

// parseDockerfile parses a Dockerfile (path relative to the repository
// root) with BuildKit's parser and instructions packages, collecting every
// warning their linter gives, and reads the ignore file BuildKit uses for
// it (<Dockerfile>.dockerignore beside it).
func parseDockerfile(t *testing.T, path string) *dockerfile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, path))
	if err != nil {
		t.Fatal(err)
	}
	return parseDockerfileBytes(t, path, raw)
}

func parseDockerfileBytes(t *testing.T, path string, raw []byte) *dockerfile {
	t.Helper()
	df := &dockerfile{path: path, metaArgs: map[string]string{}}
	res, err := parser.Parse(bytes.NewReader(raw))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	for _, w := range res.Warnings {
		df.warnings = append(df.warnings, w.Short)
	}
	lint := linter.New(&linter.Config{Warn: func(rule, _, _, msg string, loc []parser.Range) {
		line := 0
		if len(loc) > 0 {
			line = loc[0].Start.Line
		}
		df.warnings = append(df.warnings, fmt.Sprintf("line %d: %s: %s", line, rule, msg))
	}})
	stages, metaArgs, err := instructions.Parse(res.AST, lint)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	df.stages = stages
	for _, a := range metaArgs {
		for _, kv := range a.Args {
			df.metaArgs[kv.Key] = kv.ValueString()
		}
	}
	ign, err := os.Open(filepath.Join(repoRoot, path+".dockerignore"))
	if err != nil {
		t.Fatalf("%s: no ignore file beside it (the whole repository would be its context): %v", path, err)
	}
	defer ign.Close()
	patterns, err := ignorefile.ReadAll(ign)
	if err != nil {
		t.Fatal(err)
	}
	if df.ignore, err = patternmatcher.New(patterns); err != nil {
		t.Fatal(err)
	}
	return df
}

// base is a stage's base image with the meta ARGs' defaults expanded.
func (df *dockerfile) base(t *testing.T, s instructions.Stage) string {
	t.Helper()
	res, err := shell.NewLex('\\').ProcessWordWithMatches(s.BaseName, mapEnv(df.metaArgs))
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Unmatched) > 0 {
		t.Errorf("%s: FROM %s uses an ARG with no default before the first FROM", df.path, s.BaseName)
	}
	return res.Result
}

func (df *dockerfile) stage(name string) *instructions.Stage {
	for i := range df.stages {
		if df.stages[i].Name == name {
			return &df.stages[i]
		}
	}
	return nil
}

// commands of type T in a stage.
func commands[T instructions.Command](s *instructions.Stage) []T {
	var out []T
	for _, c := range s.Commands {
		if v, ok := c.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

// sent reports whether the build context holds path (relative to the
// repository root): it exists and the ignore file keeps it.
func (df *dockerfile) sent(path string) (bool, error) {
	if _, err := os.Stat(filepath.Join(repoRoot, path)); err != nil {
		return false, err
	}
	excluded, err := df.ignore.MatchesOrParentMatches(filepath.ToSlash(filepath.Clean(path)))
	return !excluded, err
}

// problems are the generic ones of one Dockerfile: BuildKit warns, a
// stage's base is unpinned, a COPY takes from a stage not defined before
// it, or a source that is not in the build context.
func (df *dockerfile) problems(t *testing.T) []string {
	t.Helper()
	var errs []string
	bad := func(format string, a ...any) { errs = append(errs, fmt.Sprintf(df.path+": "+format, a...)) }
	for _, w := range df.warnings {
		bad("BuildKit warns: %s", w)
	}
	if len(df.stages) == 0 {
		bad("no stage")
	}
	var earlier []string
	for _, s := range df.stages {
		base := df.base(t, s)
		if !slices.Contains(earlier, base) {
			if _, tag, ok := strings.Cut(base, ":"); !ok || tag == "" || tag == "latest" {
				bad("stage %q is built on %q: pin a release tag", s.Name, base)
			}
		}
		for _, c := range commands[*instructions.CopyCommand](&s) {
			if c.From != "" {
				if !slices.Contains(earlier, c.From) {
					bad("COPY --from=%s: no stage of that name before %q", c.From, s.Name)
				}
				continue
			}
			for _, src := range c.SourcePaths {
				ok, err := df.sent(src)
				switch {
				case err != nil:
					bad("COPY %s: %v", src, err)
				case !ok:
					bad("COPY %s: left out of the build context by %s.dockerignore", src, filepath.Base(df.path))
				}
			}
		}
		for _, c := range commands[*instructions.AddCommand](&s) {
			bad("ADD %v: use COPY (ADD fetches URLs and unpacks archives)", c.SourcePaths)
		}
		earlier = append(earlier, s.Name)
	}
	return errs
}

// TestDockerfiles: both images' Dockerfiles parse with BuildKit's own
// parser without a warning from it or from the linter rules it runs at
// parse time (FROM/AS and stage-name casing; the rest of `docker build
// --check` needs the base images), build on pinned bases, and copy only
// what exists and is in their build context.
func TestDockerfiles(t *testing.T) {
	for _, path := range []string{pegadDockerfile, engineDockerfile} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			for _, e := range parseDockerfile(t, path).problems(t) {
				t.Error(e)
			}
		})
	}
}

// TestDockerfileChecksCanFail: the generic checks catch a COPY of a file
// that is not in the repository, one the ignore file leaves out, a COPY
// --from of an unknown stage, an unpinned base and a linter warning.
func TestDockerfileChecksCanFail(t *testing.T) {
	cases := []struct {
		name, dockerfile, want string
	}{
		{"missing source", "FROM debian:12-slim\nCOPY no-such-dir/ /x/\n", "no-such-dir"},
		{"ignored source", "FROM debian:12-slim\nCOPY docs/ /x/\n", "left out of the build context"},
		{"unknown stage", "FROM debian:12-slim AS runtime\nCOPY --from=build /out/pegad /usr/local/bin/\n", "no stage of that name"},
		{"latest", "FROM vllm/vllm-openai:latest\n", "pin a release tag"},
		{"no tag", "FROM debian\n", "pin a release tag"},
		{"lint: FROM and AS cased differently", "FROM debian:12-slim as runtime\n", "FromAsCasing"},
		{"lint: stage name casing", "FROM debian:12-slim AS Runtime\n", "StageNameCasing"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The pegad image's ignore file: docs/ is not sent.
			df := parseDockerfileBytes(t, pegadDockerfile, []byte(tc.dockerfile))
			if errs := df.problems(t); !strings.Contains(strings.Join(errs, "\n"), tc.want) {
				t.Fatalf("problems %q, want one containing %q", errs, tc.want)
			}
		})
	}
}

// goPackage is what `go list -json` says of a package.
type goPackage struct {
	ImportPath string
	Dir        string
	Module     *struct{ Main bool }
	GoFiles    []string
	CgoFiles   []string
	CFiles     []string
	HFiles     []string
	EmbedFiles []string
}

// mainPackages lists the main module's packages that pegad and pegactl
// are built from, with their files (relative to the repository root).
func mainPackages(t *testing.T) map[string][]string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("SKIP: go not found")
	}
	root, err := filepath.Abs(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(goCmd, "list", "-deps", "-json", "./cmd/pegad", "./cmd/pegactl")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := map[string][]string{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Module == nil || !p.Module.Main {
			continue
		}
		rel, err := filepath.Rel(root, p.Dir)
		if err != nil {
			t.Fatal(err)
		}
		var files []string
		for _, f := range slices.Concat(p.GoFiles, p.CgoFiles, p.CFiles, p.HFiles, p.EmbedFiles) {
			files = append(files, filepath.ToSlash(filepath.Join(rel, f)))
		}
		pkgs[filepath.ToSlash(rel)] = files
	}
	if len(pkgs) == 0 {
		t.Fatal("go list found no package of the main module")
	}
	return pkgs
}

// makeVars reads `NAME := value` and `NAME ?= value` lines of the Makefile.
func makeVars(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{}
	for _, m := range regexp.MustCompile(`(?m)^([A-Z_]+) *[:?]?= *(.*)$`).FindAllStringSubmatch(string(raw), -1) {
		vars[m[1]] = strings.TrimSpace(m[2])
	}
	return vars
}

// ldflagsX is what the Makefile's LDFLAGS stamps: symbol → make variable
// (github.com/pegaflow/pegad/internal/version.Version → VERSION).
func ldflagsX(t *testing.T) map[string]string {
	t.Helper()
	vars := makeVars(t)
	ld := strings.ReplaceAll(vars["LDFLAGS"], "$(MODULE)", vars["MODULE"])
	x := map[string]string{}
	for _, m := range regexp.MustCompile(`-X ([^= ]+)=\$\(([A-Z_]+)\)`).FindAllStringSubmatch(ld, -1) {
		x[m[1]] = m[2]
	}
	if len(x) == 0 {
		t.Fatalf("no -X NAME=$(VAR) in the Makefile's LDFLAGS %q", ld)
	}
	return x
}

// goDirective is go.mod's go line.
func goDirective(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^go (\S+)$`).FindStringSubmatch(string(raw))
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	return m[1]
}

// runLines are a stage's RUN commands, each as one string.
func runLines(s *instructions.Stage) []string {
	var out []string
	for _, r := range commands[*instructions.RunCommand](s) {
		out = append(out, strings.Join(r.CmdLine, " "))
	}
	return out
}

// stageArgs are the ARGs declared inside a stage (and so visible to its
// RUNs).
func stageArgs(s *instructions.Stage) []string {
	var out []string
	for _, a := range commands[*instructions.ArgCommand](s) {
		for _, kv := range a.Args {
			out = append(out, kv.Key)
		}
	}
	return out
}

// TestPegadImage: deploy/image/Dockerfile builds pegad and pegactl with
// go.mod's Go on Debian 12, stamped as the Makefile stamps them, from
// sources that hold every package they import; and runs them on Debian 12
// with libibverbs, the rdma-core providers and CA certificates, as a
// non-root user, with pegad as the entrypoint.
func TestPegadImage(t *testing.T) {
	df := parseDockerfile(t, pegadDockerfile)
	build, runtime := df.stage("build"), df.stage("runtime")
	if build == nil || runtime == nil || df.stages[len(df.stages)-1].Name != "runtime" {
		t.Fatalf("stages %v: want build, then runtime last", stageNames(df))
	}

	t.Run("build stage", func(t *testing.T) {
		if got, want := df.base(t, *build), "golang:"+goDirective(t)+"-bookworm"; got != want {
			t.Errorf("build stage on %s; want %s (go.mod's go line, Debian 12 as the runtime)", got, want)
		}
		runs := strings.Join(runLines(build), "\n")
		if !strings.Contains(runs, "go build") || !strings.Contains(runs, "./cmd/pegad") || !strings.Contains(runs, "./cmd/pegactl") {
			t.Errorf("build stage does not go build ./cmd/pegad and ./cmd/pegactl:\n%s", runs)
		}
		if !strings.Contains(runs, "CGO_ENABLED=1") {
			t.Error("build stage does not build with cgo: the verbs transport would be missing")
		}
		args := stageArgs(build)
		for sym, v := range ldflagsX(t) {
			if want := "-X " + sym + "=${" + v + "}"; !strings.Contains(runs, want) {
				t.Errorf("build stage does not stamp %q (the Makefile's LDFLAGS)", want)
			}
			if !slices.Contains(args, v) {
				t.Errorf("build stage does not declare ARG %s", v)
			}
		}
	})

	t.Run("sources", func(t *testing.T) {
		var srcs []string
		for _, c := range commands[*instructions.CopyCommand](build) {
			if c.From == "" {
				srcs = append(srcs, c.SourcePaths...)
			}
		}
		for _, must := range []string{"go.mod", "go.sum"} {
			if !slices.Contains(srcs, must) {
				t.Errorf("build stage does not copy %s", must)
			}
		}
		for dir, files := range mainPackages(t) {
			covered := slices.ContainsFunc(srcs, func(s string) bool {
				s = strings.TrimSuffix(filepath.ToSlash(filepath.Clean(s)), "/")
				return s == "." || dir == s || strings.HasPrefix(dir, s+"/")
			})
			if !covered {
				t.Errorf("package %s (imported by pegad or pegactl) is not copied into the build stage", dir)
				continue
			}
			for _, f := range files {
				if ok, err := df.sent(f); err != nil || !ok {
					t.Errorf("%s (a file of package %s) is not in the build context: %v", f, dir, err)
				}
			}
		}
	})

	t.Run("runtime stage", func(t *testing.T) {
		if base := df.base(t, *runtime); base != "debian:12-slim" && base != "debian:12" && !strings.HasPrefix(base, "debian:bookworm") {
			t.Errorf("runtime stage on %s; want Debian 12", base)
		}
		runs := strings.Join(runLines(runtime), "\n")
		for _, pkg := range []string{"libibverbs1", "ibverbs-providers", "ca-certificates"} {
			if !regexp.MustCompile(`apt-get install[^\n&|;]*\b` + regexp.QuoteMeta(pkg) + `\b`).MatchString(runs) {
				t.Errorf("runtime stage does not apt-get install %s", pkg)
			}
		}
		var bins []string
		for _, c := range commands[*instructions.CopyCommand](runtime) {
			if c.From == "build" && c.DestPath == "/usr/local/bin/" {
				for _, s := range c.SourcePaths {
					bins = append(bins, filepath.Base(s))
				}
			}
		}
		for _, b := range []string{"pegad", "pegactl"} {
			if !slices.Contains(bins, b) {
				t.Errorf("runtime stage does not copy %s from the build stage into /usr/local/bin/ (got %v)", b, bins)
			}
		}
		eps := commands[*instructions.EntrypointCommand](runtime)
		if len(eps) != 1 || eps[0].PrependShell || !slices.Equal(eps[0].CmdLine, []string{"/usr/local/bin/pegad"}) {
			t.Errorf("entrypoint %+v; want exec form [\"/usr/local/bin/pegad\"] (signals reach pegad, not a shell)", eps)
		}
		cmds := commands[*instructions.CmdCommand](runtime)
		if len(cmds) != 1 || !slices.Equal(cmds[0].CmdLine, []string{"serve"}) {
			t.Errorf("CMD %+v; want [\"serve\"]", cmds)
		}
		users := commands[*instructions.UserCommand](runtime)
		if len(users) == 0 {
			t.Fatal("runtime stage sets no USER: it would run as root")
		}
		if u, _, _ := strings.Cut(users[len(users)-1].User, ":"); u == "0" || u == "root" {
			t.Errorf("runtime stage runs as %s; want an unprivileged user (the chart runs it as root for IPC_LOCK)", u)
		}
	})
}

// TestChartRunsImageAsRoot: the image's user is unprivileged, and the
// chart's pegad container runs as uid 0, the only user IPC_LOCK reaches
// (no ambient capabilities in Kubernetes): else mlock and the RDMA
// registration of the pool would be bound by RLIMIT_MEMLOCK.
func TestChartRunsImageAsRoot(t *testing.T) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			o := decode(t, render(t, v.values))
			sc := container(o, "pegad").SecurityContext
			if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != 0 {
				t.Errorf("pegad container securityContext %+v: want runAsUser 0 with IPC_LOCK (the image's USER is not root)", sc)
			}
		})
	}
}

func stageNames(df *dockerfile) []string {
	var out []string
	for _, s := range df.stages {
		out = append(out, s.Name)
	}
	return out
}

// chartImage is the pegad image the chart's defaults name:
// values.yaml's image.repository at Chart.yaml's appVersion.
func chartImage(t *testing.T) (repo, tag string) {
	t.Helper()
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	var values struct {
		Image struct {
			Repository string `json:"repository"`
			Tag        string `json:"tag"`
		} `json:"image"`
	}
	for f, out := range map[string]any{"Chart.yaml": &chart, "values.yaml": &values} {
		raw, err := os.ReadFile(filepath.Join(chartDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.Unmarshal(raw, out); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
	}
	if values.Image.Tag != "" {
		t.Errorf("values.yaml sets image.tag %q: the one place of the tag is Chart.yaml's appVersion", values.Image.Tag)
	}
	if chart.AppVersion == "" || values.Image.Repository == "" {
		t.Fatalf("Chart.yaml appVersion %q, values.yaml image.repository %q", chart.AppVersion, values.Image.Repository)
	}
	return values.Image.Repository, chart.AppVersion
}

// vllmPin is deploy/image/vllm.Dockerfile's pin of vLLM: a release and a
// commit.
func vllmPin(t *testing.T) (release, commit string) {
	t.Helper()
	df := parseDockerfile(t, engineDockerfile)
	release, commit = df.metaArgs["VLLM_VERSION"], df.metaArgs["VLLM_COMMIT"]
	if !regexp.MustCompile(`^v\d+\.\d+\.\d+$`).MatchString(release) {
		t.Errorf("%s: ARG VLLM_VERSION=%q is not a release tag vX.Y.Z", engineDockerfile, release)
	}
	if !regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(commit) {
		t.Errorf("%s: ARG VLLM_COMMIT=%q is not a full commit hash", engineDockerfile, commit)
	}
	return release, commit
}

// makeImages runs `make -n image image-vllm` and returns the -t tag and
// --build-arg values of each build command, by Dockerfile.
func makeImages(t *testing.T) map[string]struct {
	tag  string
	args map[string]string
} {
	t.Helper()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("SKIP: make not found")
	}
	cmd := exec.Command("make", "-s", "-n", "-C", repoRoot, "image", "image-vllm", "DOCKER=docker", "VERSION=v9.9.9-test", "COMMIT=abc1234")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image image-vllm: %v\n%s", err, out)
	}
	got := map[string]struct {
		tag  string
		args map[string]string
	}{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != "docker" || f[1] != "build" {
			continue
		}
		file, tag, args := "", "", map[string]string{}
		for i := 2; i+1 < len(f); i++ {
			switch f[i] {
			case "-f":
				file = f[i+1]
			case "-t":
				tag = f[i+1]
			case "--build-arg":
				k, v, _ := strings.Cut(f[i+1], "=")
				args[k] = v
			}
		}
		if f[len(f)-1] != "." {
			t.Errorf("make image builds with context %q; the Dockerfiles copy from the repository root", f[len(f)-1])
		}
		got[file] = struct {
			tag  string
			args map[string]string
		}{tag, args}
	}
	return got
}

// TestImageTags: the pegad image's tag is named in one place, Chart.yaml's
// appVersion: the chart's default render and the plain manifests use
// repository:appVersion, `make image` builds that tag (stamped with the
// version the Makefile's LDFLAGS use), and no other file under deploy/ or
// docs/ spells a tag of it. The vLLM example runs the image
// `make image-vllm` builds, tagged with vLLM's release.
func TestImageTags(t *testing.T) {
	repo, tag := chartImage(t)
	want := repo + ":" + tag
	o := decode(t, render(t, ""))
	if got := container(o, "pegad").Image; got != want {
		t.Errorf("chart's pegad image %q; want %q", got, want)
	}
	raw, err := os.ReadFile(manifests)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), "image: "+want+"\n") {
		t.Errorf("%s does not run %s", manifests, want)
	}

	builds := makeImages(t)
	pb, ok := builds[pegadDockerfile]
	if !ok {
		t.Fatalf("make image does not build %s: %v", pegadDockerfile, builds)
	}
	if pb.tag != want {
		t.Errorf("make image tags %q; the chart runs %q", pb.tag, want)
	}
	for _, v := range ldflagsX(t) {
		if pb.args[v] != map[string]string{"VERSION": "v9.9.9-test", "COMMIT": "abc1234"}[v] {
			t.Errorf("make image passes --build-arg %s=%q; want the Makefile's $(%s)", v, pb.args[v], v)
		}
	}

	release, _ := vllmPin(t)
	eb, ok := builds[engineDockerfile]
	if !ok {
		t.Fatalf("make image-vllm does not build %s: %v", engineDockerfile, builds)
	}
	if !strings.Contains(eb.tag, ":"+release+"-") {
		t.Errorf("make image-vllm tags %q: not by vLLM's release %s", eb.tag, release)
	}
	var dep struct {
		Spec struct {
			Template struct {
				Spec struct {
					Containers []struct {
						Image string `json:"image"`
					} `json:"containers"`
				} `json:"spec"`
			} `json:"template"`
		} `json:"spec"`
	}
	ex, err := os.ReadFile(engineFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(ex, &dep); err != nil {
		t.Fatal(err)
	}
	if cs := dep.Spec.Template.Spec.Containers; len(cs) != 1 || cs[0].Image != eb.tag {
		t.Errorf("%s runs %+v; want the engine image make image-vllm builds, %s", engineFile, cs, eb.tag)
	}

	// No second place: the tag is spelt nowhere else (the generated
	// manifests aside).
	tagged := regexp.MustCompile(regexp.QuoteMeta(repo) + `:[A-Za-z0-9$({][^\s"'` + "`" + `]*`)
	eachDocFile(t, func(rel string, b []byte) {
		if rel == "deploy/kubernetes/"+manifests || strings.HasSuffix(rel, "_test.go") {
			return
		}
		for _, m := range tagged.FindAllString(string(b), -1) {
			t.Errorf("%s names the image tag %s: write the tag in Chart.yaml's appVersion only", rel, m)
		}
	})
}

// TestEngineImage: deploy/image/vllm.Dockerfile is vLLM's official image
// at the pinned release with the pegad package installed from
// clients/python, checked at build time to import pegad.vllm against
// that vLLM; the pin's commit is the one the connector's interface stubs
// copy, and docs/engines.md names both.
func TestEngineImage(t *testing.T) {
	df := parseDockerfile(t, engineDockerfile)
	release, commit := vllmPin(t)
	if len(df.stages) != 1 {
		t.Fatalf("stages %v; want one", stageNames(df))
	}
	s := &df.stages[0]
	if got, want := df.base(t, *s), "vllm/vllm-openai:"+release; got != want {
		t.Errorf("built on %s; want vLLM's official image %s", got, want)
	}
	copied := false
	for _, c := range commands[*instructions.CopyCommand](s) {
		if c.From == "" && slices.ContainsFunc(c.SourcePaths, func(p string) bool { return filepath.Clean(p) == "clients/python" }) {
			copied = true
		}
	}
	if !copied {
		t.Error("does not COPY clients/python")
	}
	if ok, err := df.sent("clients/python/pyproject.toml"); err != nil || !ok {
		t.Errorf("clients/python/pyproject.toml is not in the build context: %v", err)
	}
	runs := strings.Join(runLines(s), "\n")
	if !strings.Contains(runs, "pip install") || !strings.Contains(runs, "import") || !strings.Contains(runs, "pegad.vllm") {
		t.Errorf("does not pip install the package and import pegad.vllm:\n%s", runs)
	}

	stub, err := os.ReadFile(filepath.Join(repoRoot, stubBase))
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`UPSTREAM_COMMIT = "([0-9a-f]{40})"`).FindSubmatch(stub); m == nil || string(m[1]) != commit {
		t.Errorf("VLLM_COMMIT %s; the connector's stubs (%s) copy commit %q", commit, stubBase, m)
	}
	eng, err := os.ReadFile(filepath.Join(repoRoot, "docs/engines.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, pin := range []string{release, commit} {
		if !strings.Contains(string(eng), "`"+pin+"`") {
			t.Errorf("docs/engines.md does not name vLLM's pin %s", pin)
		}
	}
}
