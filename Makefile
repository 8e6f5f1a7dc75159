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
PROTOS := $(wildcard api/pegad/v1/*.proto)

.PHONY: all build test test-short bench bench-all fuzz proto proto-check lint vet fmt-check nocgo tidy-check staticcheck e2e reliability clean help

all: build

help: ## list targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

build: ## bin/pegad and bin/pegactl, version-stamped
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/pegad ./cmd/pegad
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/pegactl ./cmd/pegactl

test: ## every test, with the race detector
	$(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

test-short: ## quick tests (-short), no race detector
	$(GO) test -short -count=1 -timeout 5m ./...

bench: ## paired benchmarks: pegad paths vs baselines measured in the same run, table of ratios (BENCHTIME, BENCHCOUNT)
	BENCHTIME=$(BENCHTIME) BENCHCOUNT=$(BENCHCOUNT) GO=$(GO) scripts/bench.sh

bench-all: ## every Benchmark in the module, raw go test output (BENCHTIME, BENCHCOUNT)
	BENCHTIME=$(BENCHTIME) BENCHCOUNT=$(BENCHCOUNT) GO=$(GO) scripts/bench.sh all

fuzz: ## every fuzz target for FUZZTIME each (default 10s)
	FUZZTIME=$(FUZZTIME) GO=$(GO) scripts/fuzz.sh

proto: ## regenerate api/ Go code (protoc + libprotobuf-dev; plugins pinned in go.mod's tool block)
	protoc -I api -I /usr/include \
		--plugin=protoc-gen-go="$$($(GO) tool -n protoc-gen-go)" \
		--plugin=protoc-gen-go-grpc="$$($(GO) tool -n protoc-gen-go-grpc)" \
		--go_out=. --go_opt=module=$(MODULE) \
		--go-grpc_out=. --go-grpc_opt=module=$(MODULE) \
		$(PROTOS)

proto-check: proto ## regenerate and fail if the committed code differs
	git diff --exit-code -- api/

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

nocgo: ## the binaries build without cgo (tcp transport only)
	CGO_ENABLED=0 $(GO) build ./...

tidy-check: ## go.mod and go.sum tidy (direct dependencies not marked indirect)
	$(GO) mod tidy -diff

staticcheck: ## staticcheck, pinned in go.mod's tool block: 0 findings
	$(GO) tool staticcheck ./...

lint: vet fmt-check nocgo tidy-check staticcheck ## go vet, gofmt, CGO_ENABLED=0 build, go mod tidy -diff, staticcheck

reliability: ## reliability suite: real pegads in netns under faults, one totals line (root; RUN=scenario for one)
	@rm -f bin/.reliability-totals; mkdir -p bin; rc=0; \
	PEGAD_RELIABILITY=1 PEGAD_RELIABILITY_TOTALS=$(CURDIR)/bin/.reliability-totals \
		$(GO) test -count=1 -timeout 12m -v -run '^TestReliability$$$(if $(RUN),/$(RUN),)' ./internal/reliability/ || rc=$$?; \
	if [[ -s bin/.reliability-totals ]]; then cat bin/.reliability-totals; \
	else echo "reliability: no totals (the suite did not finish, exit $$rc)"; [[ $$rc -ne 0 ]] || rc=1; fi; exit $$rc

e2e: ## scripted end-to-end checks (scripts/e2e-*.sh) on real binaries
	@set -e; for s in scripts/e2e-*.sh; do echo "==> $$s"; bash "$$s"; done

clean:
	rm -rf bin/
