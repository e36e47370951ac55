# trainmeter — see README.md. `make demo` and `make test` work on a fresh machine.
SHELL := /bin/bash
GO ?= go
# go-nvml's header marks some NVML calls deprecated; the warnings are noise.
export CGO_CFLAGS ?= -Wno-deprecated-declarations
BUF := $(GO) tool -modfile=tools/go.mod buf
BIN := bin

.PHONY: console-screenshots all build proto proto-check staticcheck test test-go accuracy-check fuzz-short test-python test-e2e vet fmt-check demo clean install uninstall deb bench

all: build

# --version of both binaries: VERSION (below) plus the commit.
build:
	$(GO) build -ldflags "-X github.com/trainmeter/trainmeter/internal/buildinfo.version=$(VERSION)+$(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)" \
		-o $(BIN)/ ./agent/cmd/... ./collector/cmd/...

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
	$(GO) test -race -count=1 -timeout 30m ./...

# The accuracy study (docs/accuracy.md): its tables must be what it computes.
# Not under -race (pure arithmetic, many times slower there), so test-go skips it.
accuracy-check:
	$(GO) test -count=1 -run 'TestAccuracyStudy|TestNaivePollerErrors' ./internal/fakenvml/

# The torch tests (tests_torch) run with the first interpreter that can import
# torch (scripts/torch-python.sh); without one they are skipped, unless
# TRAINMETER_REQUIRE_TORCH=1 or CI=true (set in CI), where that fails.
# A suite's output is cut to its summary when it passes and shown whole when
# it fails (scripts/quiet-unless-failed.sh).
test-python:
	cd clients/python && ../../scripts/quiet-unless-failed.sh 5 python3 -m unittest discover -s tests -v
	@if py=$$(scripts/torch-python.sh); then \
		echo "test-python: torch tests with $$py"; \
		cd clients/python && ../../scripts/quiet-unless-failed.sh 5 $$py -m unittest discover -s tests_torch -v && \
		../../scripts/quiet-unless-failed.sh 3 $$py -m unittest discover -s tests -k real_torch; \
	elif [ "$${TRAINMETER_REQUIRE_TORCH:-}" = 1 ] || [ "$${CI:-}" = true ]; then \
		echo "test-python: no python can import torch (apt-get install python3-torch)"; exit 1; \
	else echo "test-python: SKIPPING the torch tests: no python can import torch (apt-get install python3-torch)"; fi

# Screenshots of every console page at 1,400 px (docs/console.md embeds
# them): the real collector and agents, headless Chromium; fails when a label
# overflows its box or a chart has no data (e2e TestConsoleScreenshots).
console-screenshots:
	TRAINMETER_SCREENSHOT_DIR=$(CURDIR)/docs/console TRAINMETER_REQUIRE_CHROMIUM=1 \
		$(GO) test -count=1 -run '^TestConsoleScreenshots$$' ./e2e

# The real binaries end to end, plus grpcurl against server reflection.
test-e2e: build
	scripts/grpcurl-check.sh

# A short run of every fuzz target (the committed corpora in testdata/fuzz
# always run as plain tests in test-go). -fuzz takes one package and one
# target at a time. The budgets are counts of inputs, not durations: with a
# duration, Go 1.26's fuzz coordinator can fail a target with a bare "context
# deadline exceeded" when a worker is mid-input at the deadline
# (go.dev/issue/75804, fixed in Go 1.27). Each count is about 5 s of fuzzing
# on 2 cores. FUZZTIME=1m (or =1000000x) make fuzz-short fuzzes longer.
FUZZTIME ?=
FUZZ_BUDGET = $(or $(FUZZTIME),$(1))
fuzz-short:
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=$(call FUZZ_BUDGET,200000x) ./agent/internal/trainerproto
	$(GO) test -run='^$$' -fuzz='^FuzzFlatPath$$' -fuzztime=$(call FUZZ_BUDGET,200000x) ./agent/internal/trainerproto
	$(GO) test -run='^$$' -fuzz='^FuzzValidateBatch$$' -fuzztime=$(call FUZZ_BUDGET,60000x) ./collector/internal/ingest
	$(GO) test -run='^$$' -fuzz='^FuzzAggregate$$' -fuzztime=$(call FUZZ_BUDGET,60000x) ./collector/internal/ingest
	$(GO) test -run='^$$' -fuzz='^FuzzForeignNodeCannotChangeOtherRuns$$' -fuzztime=$(call FUZZ_BUDGET,1500x) ./collector/internal/ingest
	$(GO) test -run='^$$' -fuzz='^FuzzOpenSegmentTail$$' -fuzztime=$(call FUZZ_BUDGET,1500x) ./agent/internal/spool
	$(GO) test -run='^$$' -fuzz='^FuzzParse$$' -fuzztime=$(call FUZZ_BUDGET,200000x) ./agent/internal/gpu/replay
	$(GO) test -run='^$$' -fuzz='^FuzzParseMetrics$$' -fuzztime=$(call FUZZ_BUDGET,300000x) ./internal/gpu/amdgpu
	$(GO) test -run='^$$' -fuzz='^FuzzParsePriceList$$' -fuzztime=$(call FUZZ_BUDGET,60000x) ./collector/internal/pricing/prices
	$(GO) test -run='^$$' -fuzz='^FuzzProviderAnswers$$' -fuzztime=$(call FUZZ_BUDGET,80000x) ./collector/internal/pricing/prices
	$(GO) test -run='^$$' -fuzz='^FuzzParseAnswer$$' -fuzztime=$(call FUZZ_BUDGET,50000x) ./collector/internal/pricing/carbonwatch

test: fmt-check vet staticcheck proto-check test-go accuracy-check fuzz-short test-python test-e2e

# staticcheck, pinned in tools/go.mod; part of `make test`.
staticcheck:
	$(GO) tool -modfile=tools/go.mod staticcheck ./...

# Benchmarks (docs/benchmarks.md; not part of `make test`): the Go
# benchmarks of the hot paths, then short runs of trainmeter-loadgen against
# the real binaries: collector ingest (with the OpenTelemetry Collector side
# by side when scripts/otelcol-build.sh has one cached or OTELCOL=path),
# raw samples, and the agent (CPU, memory, tick jitter, trainer socket).
# The ratios of issue 21 are printed by the load generator itself: the
# collector's GPU-samples per CPU-second against the OTel Collector's at
# 1,000 and 3,000 agents ("ratio trainmeter/otelcol"), and the agent's CPU
# and context switches against a bare Go 50 ms ticker run beside it
# ("ratio_agent/bare_go_ticker", "ratio_switches"), sampling only and with
# one trainer stepping 10 times a second. AGENT_DURATION is longer because
# CPU time comes in 10 ms ticks and the bare ticker uses a few per second.
BENCH_PKGS := ./pkg/energy ./agent/internal/spool ./agent/internal/trainerproto ./collector/internal/aggregate \
	./collector/internal/store ./collector/internal/server
# The web console's pages at scale (docs/benchmarks.md, "Web console").
BENCH_PKGS += ./collector/internal/console
BENCHTIME ?= 1s
LOADGEN_DURATION ?= 10s
AGENT_DURATION ?= 60s
OTELCOL ?= $(shell scripts/otelcol-build.sh --cached-only 2>/dev/null)
bench: build
	$(GO) test -run '^$$' -bench . -benchmem -benchtime $(BENCHTIME) $(BENCH_PKGS)
	$(BIN)/trainmeter-loadgen --collector-bin $(BIN)/trainmeter --agents 100,1000,3000 --duration $(LOADGEN_DURATION) \
		--export-bin $(BIN)/trainmeter $(if $(OTELCOL),--otelcol-bin $(OTELCOL))
	$(BIN)/trainmeter-loadgen --collector-bin $(BIN)/trainmeter --agents 500 --raw-samples 250 --duration $(LOADGEN_DURATION) --probes 0
	$(BIN)/trainmeter-loadgen --collector-bin $(BIN)/trainmeter --agent-bin $(BIN)/trainmeter-agent --duration $(AGENT_DURATION) --ranks 0
	$(BIN)/trainmeter-loadgen --collector-bin $(BIN)/trainmeter --agent-bin $(BIN)/trainmeter-agent --duration $(AGENT_DURATION) \
		--ranks 1 --step-every 100ms
	$(BIN)/trainmeter-loadgen --collector-bin $(BIN)/trainmeter --agent-bin $(BIN)/trainmeter-agent --duration $(LOADGEN_DURATION) \
		--ranks 64 --step-every 0

# Install (docs/deploy.md). PREFIX=/usr as Debian; DESTDIR stages (packaging).
# Units go to $(PREFIX)/lib/systemd/system (searched by systemd for /usr and
# /usr/local) with ExecStart rewritten to $(BINDIR); configs in /etc/trainmeter
# are installed only where none exists, so a reinstall keeps local edits. With
# no DESTDIR and as root, the trainmeter user/group are created too.
PREFIX ?= /usr
BINDIR ?= $(PREFIX)/bin
UNITDIR ?= $(PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(PREFIX)/lib/tmpfiles.d
SYSCONFDIR ?= /etc
DESTDIR ?=

install: build
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(SYSUSERSDIR) $(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(SYSCONFDIR)/trainmeter
	install -m 0755 $(BIN)/trainmeter-agent $(BIN)/trainmeter $(DESTDIR)$(BINDIR)/
	for u in trainmeter-agent.service trainmeter.service; do \
		sed 's|/usr/bin/|$(BINDIR)/|g' deploy/systemd/$$u > $(DESTDIR)$(UNITDIR)/$$u.tmp && \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$u.tmp && mv $(DESTDIR)$(UNITDIR)/$$u.tmp $(DESTDIR)$(UNITDIR)/$$u || exit 1; \
	done
	install -m 0644 deploy/sysusers.d/trainmeter.conf $(DESTDIR)$(SYSUSERSDIR)/trainmeter.conf
	install -m 0644 deploy/tmpfiles.d/trainmeter-rapl.conf $(DESTDIR)$(TMPFILESDIR)/trainmeter-rapl.conf
	@for f in agent.yaml collector.yaml; do \
		if [ -e $(DESTDIR)$(SYSCONFDIR)/trainmeter/$$f ]; then echo "install: keeping existing $(DESTDIR)$(SYSCONFDIR)/trainmeter/$$f"; \
		else install -m 0644 deploy/etc/trainmeter/$$f $(DESTDIR)$(SYSCONFDIR)/trainmeter/$$f || exit 1; fi; \
	done
	@if [ -z "$(DESTDIR)" ] && [ "$$(id -u)" = 0 ]; then \
		if command -v systemd-sysusers >/dev/null 2>&1; then systemd-sysusers $(SYSUSERSDIR)/trainmeter.conf; \
		else getent group trainmeter >/dev/null || groupadd --system trainmeter; \
		getent passwd trainmeter >/dev/null || useradd --system --gid trainmeter --no-create-home \
			--home-dir /var/lib/trainmeter --shell /usr/sbin/nologin --comment "trainmeter daemons" trainmeter; fi && \
		getent passwd trainmeter && \
		if [ -d /run/systemd/system ]; then systemctl daemon-reload && (systemd-tmpfiles --create $(TMPFILESDIR)/trainmeter-rapl.conf || true); fi && \
		echo "install: done; edit $(SYSCONFDIR)/trainmeter/agent.yaml, then: systemctl enable --now trainmeter-agent"; \
	fi

# Removes what install put outside /etc; keeps the configs, the user and /var/lib/trainmeter.
uninstall:
	rm -f $(DESTDIR)$(BINDIR)/trainmeter-agent $(DESTDIR)$(BINDIR)/trainmeter \
		$(DESTDIR)$(UNITDIR)/trainmeter-agent.service $(DESTDIR)$(UNITDIR)/trainmeter.service \
		$(DESTDIR)$(SYSUSERSDIR)/trainmeter.conf $(DESTDIR)$(TMPFILESDIR)/trainmeter-rapl.conf
	@echo "uninstall: kept $(DESTDIR)$(SYSCONFDIR)/trainmeter, /var/lib/trainmeter and the trainmeter user"

# dist/trainmeter_$(VERSION)_amd64.deb with nfpm (pinned in tools/go.mod):
# `make install` into a staging root, packaged as deploy/nfpm.yaml says (nfpm
# runs in the staging root, so it is built there rather than run by `go tool`).
# VERSION: the latest v* tag (v1.2.0-3-gabc -> 1.2.0+3.gabc), else 0.1.0.
VERSION ?= $(or $(shell git describe --tags --match 'v[0-9]*' 2>/dev/null | sed -e 's/^v//' -e 's/-\([0-9]*\)-g/+\1.g/'),0.1.0)
DIST ?= dist
deb:
	rm -rf $(DIST)/root && mkdir -p $(DIST)/root/debian
	$(MAKE) --no-print-directory install DESTDIR=$(abspath $(DIST))/root PREFIX=/usr SYSCONFDIR=/etc
	cp deploy/debian/postinst deploy/debian/prerm deploy/debian/postrm $(DIST)/root/debian/
	$(GO) build -modfile=tools/go.mod -o $(DIST)/root/debian/nfpm github.com/goreleaser/nfpm/v2/cmd/nfpm
	cd $(DIST)/root && VERSION=$(VERSION) debian/nfpm package --config $(CURDIR)/deploy/nfpm.yaml \
		--packager deb --target $(abspath $(DIST))/trainmeter_$(VERSION)_amd64.deb
	rm -rf $(DIST)/root

# The main job end to end on simulated GPUs: collector, agent, two trainer
# runs that differ, then the runs table and the CSV.
# KEEP=1 leaves the demo's collector and agent running to explore.
demo: build
	KEEP=$(KEEP) scripts/demo.sh

clean:
	rm -rf $(BIN) .demo dist
