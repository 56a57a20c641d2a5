# Every target that needs PostgreSQL runs through scripts/localpg.sh, which
# starts a throwaway local server (or uses PGLEASE_TEST_DSN / DATABASE_URL
# when set) with a PgBouncer in transaction mode in front of it. See
# scripts/localpg.sh for the environment it provides.

LOCALPG := scripts/localpg.sh run --

.DEFAULT_GOAL := test
.PHONY: test lint demo stress bench bench-insert fmt pg screenshots

## test: gofmt check, go vet, build of _examples, go test -race ./...
test:
	$(LOCALPG) scripts/check.sh

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
