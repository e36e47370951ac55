# trainmeter — see README.md. `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
GO ?= go
# go-nvml's header marks some NVML calls deprecated; the warnings are noise.
export CGO_CFLAGS ?= -Wno-deprecated-declarations
BUF := $(GO) tool -modfile=tools/go.mod buf
BIN := bin

.PHONY: all build proto proto-check test test-go fuzz-short test-python test-e2e vet fmt-check demo clean

all: build

build:
	$(GO) build -o $(BIN)/ ./agent/cmd/... ./collector/cmd/...

# Regenerate the protobuf/gRPC code (offline: buf and the plugins are pinned
# in tools/go.mod and run through `go tool`).
proto:
	$(BUF) format -w
	$(BUF) lint
	$(BUF) generate

# Fails when the committed generated code is not what the .proto files give,
# or when the .proto files are not lint- and format-clean.
proto-check:
	$(BUF) lint
	$(BUF) format --diff --exit-code
	@tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; \
	$(BUF) generate -o $$tmp && \
	if ! diff -r --exclude='*.proto' $$tmp/proto proto >/dev/null; then \
		diff -r --exclude='*.proto' $$tmp/proto proto | head -20; \
		echo "proto-check: generated code is stale; run 'make proto' and commit"; exit 1; \
	fi; echo "proto-check: generated code is up to date"

vet:
	$(GO) vet ./...

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi

test-go:
	$(GO) test -race -count=1 ./...

test-python:
	cd clients/python && python3 -m unittest discover -s tests -v 2>&1 | tail -5; test $${PIPESTATUS[0]} -eq 0

# The real binaries end to end, plus grpcurl against server reflection.
test-e2e: build
	scripts/grpcurl-check.sh

# A short run of every fuzz target (the committed corpora in testdata/fuzz
# always run as plain tests in test-go). -fuzz takes one package and one
# target at a time. FUZZTIME=1m make fuzz-short fuzzes longer.
FUZZTIME ?= 5s
fuzz-short:
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=$(FUZZTIME) ./agent/internal/trainerproto
	$(GO) test -run='^$$' -fuzz='^FuzzValidateBatch$$' -fuzztime=$(FUZZTIME) ./collector/internal/ingest
	$(GO) test -run='^$$' -fuzz='^FuzzAggregate$$' -fuzztime=$(FUZZTIME) ./collector/internal/ingest

test: fmt-check vet proto-check test-go fuzz-short test-python test-e2e

# The main job end to end on simulated GPUs: collector, agent, two trainer
# runs that differ, then the runs table and the CSV.
demo: build
	scripts/demo.sh

clean:
	rm -rf $(BIN) .demo
