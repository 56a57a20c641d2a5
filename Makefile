# Every target that needs PostgreSQL runs through scripts/localpg.sh, which
# starts a throwaway local server (or uses PGLEASE_TEST_DSN / DATABASE_URL
# when set) with a PgBouncer in transaction mode in front of it. See
# scripts/localpg.sh for the environment it provides.

LOCALPG := scripts/localpg.sh run --

.DEFAULT_GOAL := test
.PHONY: test test-citus lint demo stress bench bench-insert fmt pg screenshots

## test: gofmt check, go vet, build of _examples, go test -race ./...
test:
	$(LOCALPG) scripts/check.sh

## test-citus: the tests on a Citus cluster (coordinator + 2 workers, internal/cmd/localcitus); installs Citus from $(CITUS_SRC) when missing (as root)
CITUS_SRC ?= ../shared/citus
test-citus:
	@[ -f "$$(ls -d /usr/lib/postgresql/*/lib 2>/dev/null | sort -V | tail -1)/citus.so" ] || [ -x "$(CITUS_SRC)/install.sh" ] || { echo "test-citus: Citus is not installed and its source is not in $(CITUS_SRC) (expected: install.sh and citus-13.2.2-src.tar.xz; set CITUS_SRC)" >&2; exit 1; }
	@[ ! -x "$(CITUS_SRC)/install.sh" ] || $(CITUS_SRC)/install.sh
	go run ./internal/cmd/localcitus -- go test -race -count=1 -run 'Citus' -timeout 10m . ./internal/pgsql

## lint: golangci-lint over every module (pinned in scripts/lint.sh, installed on first use)
lint:
	scripts/lint.sh

## demo: run the basic example
demo:
	$(LOCALPG) go run ./_examples/basic

## stress: the stress tests (build tag "stress")
stress:
	$(LOCALPG) go test -race -count=1 -tags stress -run 'TestStress' -timeout 80m .

## bench: pglease vs watermill-sql, NATS JetStream and Redis Streams (benchmarks/), writes benchmarks/results.md and .svg; PostgreSQL with fsync on
bench:
	scripts/install-redis.sh
	LOCALPG_DURABLE=1 $(LOCALPG) sh -c 'cd benchmarks && go run .'

## bench-insert: what one statement of 100 messages costs the server, per storage shape
bench-insert:
	$(LOCALPG) sh -c 'cd benchmarks && go test -run "^$$" -bench InsertShapes -benchtime 2000x -count 5 .'

## screenshots: the browser test of pglease ui, writing the README's screenshots to docs/img
screenshots:
	scripts/install-chromium.sh >/dev/null
	$(LOCALPG) sh -c 'cd cmd/pglease/uitest && PGLEASE_UI_SCREENSHOTS="$$PWD/../../../docs/img" go test -count=1 -run TestConsoleInABrowser ./...'

## fmt: gofmt -w every Go file of the project
fmt:
	@files="$$(scripts/gofiles.sh)"; if [ -n "$$files" ]; then gofmt -l -w $$files; fi

## pg: an interactive $SHELL with a throwaway PostgreSQL and a PgBouncer in front of it (PGLEASE_TEST_DSN, DATABASE_URL, PGLEASE_TEST_PGBOUNCER_DSN set)
pg:
	$(LOCALPG) sh -c 'echo "PGLEASE_TEST_DSN=$$PGLEASE_TEST_DSN"; echo "PGLEASE_TEST_RESTART_CMD=$$PGLEASE_TEST_RESTART_CMD"; echo "PGLEASE_TEST_PGBOUNCER_DSN=$$PGLEASE_TEST_PGBOUNCER_DSN (log: $$PGLEASE_TEST_PGBOUNCER_LOG)"; echo "exit the shell to stop PostgreSQL and PgBouncer"; exec "$${SHELL:-/bin/bash}"'
