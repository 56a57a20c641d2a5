# The make targets of pglease; `make help` lists them, docs/development.md
# says more.
#
# A target that needs PostgreSQL runs its command through localpg
# (internal/cmd/localpg, built into .tmp/bin): a throwaway local server with
# a PgBouncer in transaction mode in front of it, or the database of
# PGLEASE_TEST_DSN / DATABASE_URL when one is set. The programs Go does not
# bring (PostgreSQL, PgBouncer, Chromium, Redis) are installed from Debian's
# packages by scripts/install-deps.sh, which a target runs only when one it
# needs is missing.
#
# PG=17 or PG=18 (e.g. `make test PG=17`) runs the targets that start a
# server on that major version instead of Debian 12's 15: the build of
# scripts/build-postgresql.sh (from Debian's source package, once per
# machine, in /var/cache/pglease; PGLEASE_PG_CACHE moves it), linked from
# .tmp/postgresql-VERSION and passed to localpg and the tests in
# PGLEASE_PG_BINDIR. PG=15 names Debian's package explicitly.

LOCALPG_BIN := .tmp/bin/localpg
PG ?=
ifneq ($(filter-out 15 17 18,$(PG)),)
$(error PG=$(PG): the versions are 15 (Debian's package, the default), 17 and 18 (built by scripts/build-postgresql.sh))
endif
ifneq ($(filter 17 18,$(PG)),)
export PGLEASE_PG_BINDIR := $(CURDIR)/.tmp/postgresql-$(PG)/bin
else ifeq ($(PG),15)
export PGLEASE_PG_BINDIR := /usr/lib/postgresql/15/bin
endif
LOCALPG := $(LOCALPG_BIN) run --
# $(call DEPS,WHAT...): install-deps.sh WHAT..., when one of them is missing.
DEPS = $(if $(strip $(1)),@scripts/install-deps.sh --check $(1) || scripts/install-deps.sh $(1))
# What localpg needs to start a server: nothing when a database is given.
SERVER_DEPS := $(if $(PGLEASE_TEST_DSN)$(DATABASE_URL),,postgresql pgbouncer)
# go.work joins the modules for editors and ad-hoc commands; the targets run
# each module on its own go.mod, as a user's build does: in workspace mode
# the go command picks one version of each dependency for all the modules
# together.
export GOWORK := off
# Every Go module of the repository (the go tool's ./... stops at a nested go.mod).
MODULES := $(sort $(patsubst %/,%,$(dir $(shell find . -name go.mod -not -path "./.git/*" -not -path "*/testdata/*"))))

.DEFAULT_GOAL := help
.PHONY: help check unit test test-server test-pgbouncer test-ui lint bench bench-otel bench-insert bench-keys bench-retry demo stress pg screenshots fmt localpg test-citus bench-citus

## help: this list
help:
	@sed -n 's/^## //p' $(MAKEFILE_LIST)

## check: gofmt, vet, lint and the tests that need no database, every module: what to run before a commit, in seconds once the linter is installed
check:
	scripts/check.sh gofmt vet lint
	@$(MAKE) --no-print-directory unit

## unit: the tests that need no database (go test -short, every module): seconds
unit:
	@status=0; for m in $(MODULES); do echo "go test -short ./... ($$m)"; (cd $$m && go test -short ./...) || status=1; done; exit $$status

## test: what CI runs (.ci/run): gofmt, vet, lint, examples, every test with -race, PgBouncer, browser (scripts/check.sh)
test: localpg
	$(call DEPS,test)
	$(LOCALPG) scripts/check.sh

## test-server: the tests of what depends on the server's version (scripts/check.sh server): what CI runs with PG=17 and PG=18
test-server: localpg
	$(call DEPS,$(SERVER_DEPS))
	$(LOCALPG) scripts/check.sh server

## test-citus: the tests on a Citus cluster (coordinator + 2 workers, internal/cmd/localcitus), one package at a time (some move shards); installs Citus from $(CITUS_SRC) when missing (as root)
CITUS_SRC ?= ../shared/citus
test-citus:
	@[ -f "$$(ls -d /usr/lib/postgresql/*/lib 2>/dev/null | sort -V | tail -1)/citus.so" ] || [ -x "$(CITUS_SRC)/install.sh" ] || { echo "test-citus: Citus is not installed and its source is not in $(CITUS_SRC) (expected: install.sh and citus-13.2.2-src.tar.xz; set CITUS_SRC)" >&2; exit 1; }
	@[ ! -x "$(CITUS_SRC)/install.sh" ] || $(CITUS_SRC)/install.sh
	PGLEASE_PG_BINDIR= go run ./internal/cmd/localcitus -- go test -race -count=1 -p 1 -run 'Citus' -timeout 15m . ./internal/pgsql ./cmd/pglease ./internal/simcluster

## bench-citus: pglease on a simulated Citus cluster (each node with a CPU quota, a delaying proxy in front of each): plain PostgreSQL, then 1, 2 and 4 workers; writes benchmarks/citus-scale.md (about 10 minutes; as root, Citus installed as for test-citus)
bench-citus:
	@[ -f "$$(ls -d /usr/lib/postgresql/*/lib 2>/dev/null | sort -V | tail -1)/citus.so" ] || [ -x "$(CITUS_SRC)/install.sh" ] || { echo "bench-citus: Citus is not installed and its source is not in $(CITUS_SRC)" >&2; exit 1; }
	@[ ! -x "$(CITUS_SRC)/install.sh" ] || $(CITUS_SRC)/install.sh
	cd benchmarks && PGLEASE_PG_BINDIR= go run ./citusscale $(BENCH_CITUS_FLAGS)

## test-pgbouncer: the tests through PgBouncer in transaction mode
test-pgbouncer: localpg
	$(call DEPS,postgresql pgbouncer)
	$(LOCALPG) scripts/check.sh pooler pgbouncer

## test-ui: the browser test of `pglease ui` (headless Chromium)
test-ui: localpg
	$(call DEPS,$(SERVER_DEPS) chromium)
	$(LOCALPG) scripts/check.sh ui

## lint: golangci-lint over every module (version pinned in scripts/lint.sh, installed on first use)
lint:
	scripts/lint.sh

## bench: pglease vs watermill-sql, NATS JetStream and Redis Streams (benchmarks/), writes benchmarks/results.md and .svg, then bench-otel; PostgreSQL with fsync on
bench: localpg
	$(call DEPS,$(SERVER_DEPS))
	-$(call DEPS,redis)
	LOCALPG_DURABLE=1 $(LOCALPG) sh -c 'cd benchmarks && go run .'
	$(MAKE) bench-otel

## bench-otel: what the otel module costs a Publish and a delivery on no-op providers (30 interleaved rounds, about 2 minutes), writes benchmarks/otel-overhead.txt
bench-otel: localpg
	$(call DEPS,$(SERVER_DEPS))
	LOCALPG_DURABLE=1 $(LOCALPG) sh -c 'cd otel && go test -run "^$$" -bench Overhead -benchtime 30x . | tee ../benchmarks/otel-overhead.txt'

## bench-insert: what one statement of 100 messages costs the server, per storage shape
bench-insert: localpg
	$(call DEPS,$(SERVER_DEPS))
	$(LOCALPG) sh -c 'cd benchmarks && go test -run "^$$" -bench InsertShapes -benchtime 2000x -count 5 .'

## bench-keys: Publish with idempotency keys beside the same workload without, in one run (64 goroutines; batches of 100, also on a topic with a retention of three days, and with time-ordered keys); PostgreSQL with fsync on
bench-keys: localpg
	$(call DEPS,$(SERVER_DEPS))
	LOCALPG_DURABLE=1 $(LOCALPG) go test -run "^$$" -bench IdempotentPublish -benchtime 1x -count 3 .

## bench-retry: a poison storm under the failure policy (100 keys, one in ten always failing, MaxInFlight 16, 20 ms handler) beside the same drain without failures, in one run: the healthy keys' rate, the dead-letter count, the backoff's error; PostgreSQL with fsync on (about 6 minutes)
bench-retry: localpg
	$(call DEPS,$(SERVER_DEPS))
	LOCALPG_DURABLE=1 $(LOCALPG) go test -run "^$$" -bench PoisonStorm -benchtime 1x -count 3 -timeout 30m .

## demo: run _examples/basic (against DATABASE_URL when set, else a throwaway PostgreSQL)
demo: localpg
	$(call DEPS,$(SERVER_DEPS))
	$(LOCALPG) go run ./_examples/basic

## stress: the stress tests (build tag "stress"), about an hour
stress: localpg
	$(call DEPS,$(SERVER_DEPS))
	$(LOCALPG) go test -race -count=1 -tags stress -run 'TestStress' -timeout 80m .

## pg: an interactive $SHELL with a throwaway PostgreSQL and a PgBouncer in front of it (PGLEASE_TEST_DSN, DATABASE_URL, PGLEASE_TEST_PGBOUNCER_DSN set)
pg: localpg
	$(call DEPS,$(SERVER_DEPS))
	$(LOCALPG) sh -c 'echo "PGLEASE_TEST_DSN=$$PGLEASE_TEST_DSN"; echo "PGLEASE_TEST_RESTART_CMD=$$PGLEASE_TEST_RESTART_CMD"; echo "PGLEASE_TEST_PGBOUNCER_DSN=$$PGLEASE_TEST_PGBOUNCER_DSN (log: $$PGLEASE_TEST_PGBOUNCER_LOG)"; echo "exit the shell to stop PostgreSQL and PgBouncer"; exec "$${SHELL:-/bin/bash}"'

## screenshots: the browser test of `pglease ui`, writing the README's screenshots to docs/img
screenshots: localpg
	$(call DEPS,$(SERVER_DEPS) chromium)
	$(LOCALPG) sh -c 'cd cmd/pglease/uitest && PGLEASE_UI_SCREENSHOTS="$$PWD/../../../docs/img" go test -count=1 -run TestConsoleInABrowser ./...'

## fmt: gofmt -w every Go file of the project
fmt:
	@files="$$(scripts/gofiles.sh)"; if [ -n "$$files" ]; then gofmt -l -w $$files; fi

## localpg: build internal/cmd/localpg into .tmp/bin (every target above that needs PostgreSQL does); with PG=17 or 18, build that PostgreSQL first when it is not in the machine's cache (scripts/build-postgresql.sh: 10 to 20 minutes on 2 cores, once)
localpg:
	@go build -o $(LOCALPG_BIN) ./internal/cmd/localpg
ifneq ($(filter 17 18,$(PG)),)
	@scripts/build-postgresql.sh --check $(PG) 2>/dev/null || scripts/build-postgresql.sh $(PG)
endif
