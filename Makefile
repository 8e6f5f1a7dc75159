# pegad — build, test and maintenance targets. Run `make help` for a list.
SHELL := /bin/bash
GO ?= go
MODULE := github.com/pegaflow/pegad
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT ?= $(shell git rev-parse --short HEAD 2>/dev/null || echo unknown)
LDFLAGS := -X $(MODULE)/internal/version.Version=$(VERSION) -X $(MODULE)/internal/version.Commit=$(COMMIT)
TEST_TIMEOUT ?= 15m
FUZZTIME ?= 10s
BENCHTIME ?=
BENCHCOUNT ?=
# Build tags of every test, bench and fuzz run (and of the second vet and
# staticcheck pass): pegad_fakeverbs compiles the verbs provider's fake HCA
# (internal/ibv/verbs/fakeverbs.c and the verbs.Fake* controls), which the
# verbs, conn and requester tests drive. build, nocgo and the image never
# pass it (cmd/pegad's TestProductionBuildHasNoFakeHCA checks the binary).
TEST_TAGS ?= pegad_fakeverbs
PROTOS := $(wildcard api/pegad/v1/*.proto)
# The Python client's gRPC stubs (delete, prefetch): Debian's protoc and
# grpc_python_plugin, so they work with protobuf 3.21 and grpcio 1.51 and later.
PY_PROTOS := api/pegad/v1/local.proto
GRPC_PYTHON_PLUGIN ?= /usr/bin/grpc_python_plugin
# The Python client is tested with Debian's python3 and its packages
# (python3-grpcio, python3-protobuf, python3-numpy, python3-pytest), in a
# venv that sees them, with the package installed as a user would.
PYTHON ?= /usr/bin/python3
PY_VENV ?= bin/python-venv
# The Kubernetes checks (Helm chart rendered with Helm's Go packages,
# objects decoded into k8s.io/api types) are a module of their own, so
# Helm and the Kubernetes packages stay out of pegad's module and binaries.
# test, vet, tidy-check and staticcheck cover it too.
K8S_MOD := deploy/kubernetes

.PHONY: all build test test-short bench bench-all fuzz proto proto-check lint vet fmt-check nocgo tidy-check staticcheck e2e reliability verbs-e2e clean help python-venv python-test replay gpu-check pd-e2e

all: build

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## bin/pegad and bin/pegactl, version-stamped
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/pegad ./cmd/pegad
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/pegactl ./cmd/pegactl

test: ## every test, with the race detector (the deploy/kubernetes module's too): a line per package as it ends, one every 30 s while building or running
	set -o pipefail; $(GO) test -tags "$(TEST_TAGS)" -json -race -count=1 -timeout $(TEST_TIMEOUT) ./... | \
		$(GO) run ./scripts/testprogress --packages $$($(GO) list ./... | wc -l)
	set -o pipefail; (cd $(K8S_MOD) && $(GO) test -json -race -count=1 -timeout $(TEST_TIMEOUT) ./...) | \
		$(GO) run ./scripts/testprogress --packages $$(cd $(K8S_MOD) && $(GO) list ./... | wc -l)

test-short: ## quick tests (-short), no race detector
	$(GO) test -tags "$(TEST_TAGS)" -short -count=1 -timeout 5m ./...
	cd $(K8S_MOD) && $(GO) test -short -count=1 -timeout 5m ./...

.PHONY: k8s-manifests
k8s-manifests: ## regenerate deploy/kubernetes/pegad.yaml and pegad-monitoring.yaml from the Helm chart's defaults, and the chart's copy of the alert rules
	cd $(K8S_MOD) && PEGAD_UPDATE_MANIFESTS=1 $(GO) test -count=1 -run '^TestManifests$$' .

# The images (deploy/image; docs/kubernetes.md, Image). pegad's is tagged
# with the chart's appVersion, the one place the chart, the manifests and
# this name it; the engine image with vLLM's release (vllm.Dockerfile's
# VLLM_VERSION) and the Python package's version, the tag
# deploy/kubernetes/examples/vllm.yaml runs. DOCKER=podman or buildah
# work too (both take build -f -t --build-arg). Nothing here pushes.
DOCKER ?= docker
IMAGE_REPO ?= $(shell sed -n 's/^  repository: *//p' deploy/helm/pegad/values.yaml)
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\} *$$/\1/p' deploy/helm/pegad/Chart.yaml)
VLLM_VERSION ?= $(shell sed -n 's/^ARG VLLM_VERSION=//p' deploy/image/vllm.Dockerfile)
PY_VERSION ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' clients/python/pyproject.toml)
ENGINE_IMAGE ?= ghcr.io/pegaflow/vllm-pegad:$(VLLM_VERSION)-pegad$(PY_VERSION)

.PHONY: image image-vllm
image: ## pegad's image (deploy/image/Dockerfile), version-stamped, tagged with the chart's appVersion (DOCKER=docker|podman|buildah)
	$(DOCKER) build -f deploy/image/Dockerfile --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t $(IMAGE_REPO):$(IMAGE_TAG) .

image-vllm: ## the vLLM engine image with the pegad Python package (deploy/image/vllm.Dockerfile), which examples/vllm.yaml runs
	$(DOCKER) build -f deploy/image/vllm.Dockerfile -t $(ENGINE_IMAGE) .

bench: ## paired benchmarks: pegad paths vs baselines measured in the same run, table of ratios (BENCHTIME, BENCHCOUNT)
	BENCHTIME=$(BENCHTIME) BENCHCOUNT=$(BENCHCOUNT) GO=$(GO) TEST_TAGS="$(TEST_TAGS)" scripts/bench.sh

bench-all: ## every Benchmark in the module, raw go test output (BENCHTIME, BENCHCOUNT)
	BENCHTIME=$(BENCHTIME) BENCHCOUNT=$(BENCHCOUNT) GO=$(GO) TEST_TAGS="$(TEST_TAGS)" scripts/bench.sh all

fuzz: ## every fuzz target for FUZZTIME each (default 10s)
	FUZZTIME=$(FUZZTIME) GO=$(GO) TEST_TAGS="$(TEST_TAGS)" scripts/fuzz.sh

proto: ## regenerate api/ Go code and the Python client's stubs (protoc + libprotobuf-dev; Go plugins pinned in go.mod's tool block; Python: protobuf-compiler-grpc)
	protoc -I api -I /usr/include \
		--plugin=protoc-gen-go="$$($(GO) tool -n protoc-gen-go)" \
		--plugin=protoc-gen-go-grpc="$$($(GO) tool -n protoc-gen-go-grpc)" \
		--go_out=. --go_opt=module=$(MODULE) \
		--go-grpc_out=. --go-grpc_opt=module=$(MODULE) \
		$(PROTOS)
	protoc -I api -I /usr/include \
		--plugin=protoc-gen-grpc_python=$(GRPC_PYTHON_PLUGIN) \
		--python_out=clients/python --grpc_python_out=clients/python \
		$(PY_PROTOS)

proto-check: proto ## regenerate and fail if the committed code differs (Go and Python)
	git diff --exit-code -- api/ clients/python/pegad/v1/
	@out=$$(git ls-files --others --exclude-standard -- api/ clients/python/pegad/v1/); if [[ -n "$$out" ]]; then echo "generated but not committed:"; echo "$$out"; exit 1; fi

vet: ## go vet as built (no tags) and as tested (TEST_TAGS), both modules
	$(GO) vet ./...
	$(GO) vet -tags "$(TEST_TAGS)" ./...
	cd $(K8S_MOD) && $(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

nocgo: ## the binaries build without cgo (tcp transport only)
	CGO_ENABLED=0 $(GO) build ./...

tidy-check: ## go.mod and go.sum tidy (direct dependencies not marked indirect), both modules
	$(GO) mod tidy -diff
	cd $(K8S_MOD) && $(GO) mod tidy -diff

staticcheck: ## staticcheck, pinned in go.mod's tool block: 0 findings (both modules; this one as built and with TEST_TAGS)
	$(GO) tool staticcheck ./...
	$(GO) tool staticcheck -tags "$(TEST_TAGS)" ./...
	cd $(K8S_MOD) && "$$($(GO) -C $(CURDIR) tool -n staticcheck)" ./...

lint: vet fmt-check nocgo tidy-check staticcheck ## go vet, gofmt, CGO_ENABLED=0 build, go mod tidy -diff, staticcheck

reliability: ## reliability suite: real pegads in netns under faults, one totals line (root; RUN=scenario for one)
	@rm -f bin/.reliability-totals; mkdir -p bin; rc=0; \
	PEGAD_RELIABILITY=1 PEGAD_RELIABILITY_TOTALS=$(CURDIR)/bin/.reliability-totals \
		$(GO) test -tags "$(TEST_TAGS)" -count=1 -timeout 12m -v -run '^TestReliability$$$(if $(RUN),/$(RUN),)' ./internal/reliability/ || rc=$$?; \
	if [[ -s bin/.reliability-totals ]]; then cat bin/.reliability-totals; \
	else echo "reliability: no totals (the suite did not finish, exit $$rc)"; [[ $$rc -ne 0 ]] || rc=1; fi; exit $$rc

replay: ## replay both traces (internal/replay/testdata) through pegad at 2/5/10/20 % of their blocks, per --eviction, beside LRU, W-TinyLFU, S3-FIFO and Belady (TRACES, BLOCK_SIZE, SHARES, EVICTIONS)
	@bash scripts/replay.sh

e2e: ## scripted end-to-end checks (scripts/e2e-*.sh) on real binaries
	@set -e; for s in scripts/e2e-*.sh; do echo "==> $$s"; bash "$$s"; done

pd-e2e: ## prefill/decode disaggregation: two pegads on tcp, the tiny engines through the P/D proxy with faults, and the handoff-to-load vs bare READ sweep (redis-server; not in make test)
	GO=$(GO) PY_VENV=$(PY_VENV) scripts/pd-e2e.sh

verbs-e2e: ## --transport verbs on soft-RoCE (rdma_rxe) in a qemu guest built from Debian's packages (qemu-system-x86, cpio; cache in bin/verbs-e2e)
	GO=$(GO) TEST_TAGS="$(TEST_TAGS)" scripts/verbs-e2e/run.sh

# Install layout (make install PREFIX=... DESTDIR=...). The unit's ExecStart
# and --config are rewritten to BINDIR and SYSCONFDIR; an existing config
# file is never overwritten (the new one goes beside it as pegad.yaml.new).
PREFIX ?= /usr/local
DESTDIR ?=
BINDIR ?= $(PREFIX)/bin
SYSCONFDIR ?= /etc
UNITDIR ?= $(PREFIX)/lib/systemd/system
DATADIR ?= $(PREFIX)/share
INSTALL ?= install

.PHONY: install uninstall install-check alerts-check unit-check

install: build ## binaries, systemd unit, config, pegactl completions, alerts and dashboard (PREFIX, DESTDIR)
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSCONFDIR)/pegad \
		$(DESTDIR)$(DATADIR)/bash-completion/completions $(DESTDIR)$(DATADIR)/zsh/site-functions \
		$(DESTDIR)$(DATADIR)/fish/vendor_completions.d $(DESTDIR)$(DATADIR)/pegad/prometheus \
		$(DESTDIR)$(DATADIR)/pegad/grafana
	$(INSTALL) -m 0755 bin/pegad bin/pegactl $(DESTDIR)$(BINDIR)/
	sed -e 's#/usr/local/bin/pegad#$(BINDIR)/pegad#' -e 's#/etc/pegad/#$(SYSCONFDIR)/pegad/#' \
		deploy/systemd/pegad.service > $(DESTDIR)$(UNITDIR)/pegad.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/pegad.service
	@if [[ -e $(DESTDIR)$(SYSCONFDIR)/pegad/pegad.yaml ]]; then \
		$(INSTALL) -m 0644 configs/pegad.yaml $(DESTDIR)$(SYSCONFDIR)/pegad/pegad.yaml.new; \
		echo "kept $(DESTDIR)$(SYSCONFDIR)/pegad/pegad.yaml; the shipped one is pegad.yaml.new"; \
	else \
		$(INSTALL) -m 0644 configs/pegad.yaml $(DESTDIR)$(SYSCONFDIR)/pegad/pegad.yaml; \
	fi
	bin/pegactl completion bash > $(DESTDIR)$(DATADIR)/bash-completion/completions/pegactl
	bin/pegactl completion zsh > $(DESTDIR)$(DATADIR)/zsh/site-functions/_pegactl
	bin/pegactl completion fish > $(DESTDIR)$(DATADIR)/fish/vendor_completions.d/pegactl.fish
	$(INSTALL) -m 0644 deploy/prometheus/alerts.yaml $(DESTDIR)$(DATADIR)/pegad/prometheus/
	$(INSTALL) -m 0644 deploy/grafana/pegad.json $(DESTDIR)$(DATADIR)/pegad/grafana/

uninstall: ## remove what install placed, except the config in SYSCONFDIR
	rm -f $(DESTDIR)$(BINDIR)/pegad $(DESTDIR)$(BINDIR)/pegactl $(DESTDIR)$(UNITDIR)/pegad.service \
		$(DESTDIR)$(DATADIR)/bash-completion/completions/pegactl $(DESTDIR)$(DATADIR)/zsh/site-functions/_pegactl \
		$(DESTDIR)$(DATADIR)/fish/vendor_completions.d/pegactl.fish
	rm -rf $(DESTDIR)$(DATADIR)/pegad

install-check: ## make install into a temp dir, then check the layout, the unit (systemd-analyze) and the config
	GO=$(GO) scripts/install-check.sh

alerts-check: ## promtool check rules + promtool test rules on deploy/prometheus (Debian package prometheus)
	promtool check rules deploy/prometheus/alerts.yaml
	promtool test rules deploy/prometheus/alerts_test.yaml

unit-check: build ## systemd-analyze verify deploy/systemd/pegad.service (with ExecStart pointed at bin/pegad)
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && \
	sed 's#/usr/local/bin/pegad#$(CURDIR)/bin/pegad#' deploy/systemd/pegad.service > "$$tmp/pegad.service" && \
	out=$$(systemd-analyze verify "$$tmp/pegad.service" 2>&1) && [[ -z "$$out" ]] || { echo "$$out"; exit 1; }

python-venv: ## bin/python-venv: a venv on Debian's python3 (--system-site-packages) with clients/python installed
	rm -rf $(PY_VENV)
	$(PYTHON) -m venv --system-site-packages $(PY_VENV)
	$(PY_VENV)/bin/pip install --no-deps --no-build-isolation --quiet ./clients/python
	rm -rf clients/python/build clients/python/*.egg-info

gpu-check: ## on a machine with a GPU: the device tests on CUDA, pool registration, copy GB/s vs cudaMemcpy (not in make test)
	GO=$(GO) scripts/gpu-check.sh

python-test: python-venv ## the Python client's tests (pytest) against a real pegad built from this tree
	cd $(PY_VENV) && GO=$(GO) PEGAD_PYTHON=$(CURDIR)/$(PY_VENV)/bin/python ./bin/python -m pytest -q -p no:cacheprovider $(CURDIR)/clients/python/tests; \
		rc=$$?; if ((rc == 5)); then echo "python-test: pytest ran no tests"; fi; exit $$rc

clean:
	rm -rf bin/
