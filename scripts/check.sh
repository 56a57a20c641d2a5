#!/usr/bin/env bash
# check.sh: the full check run by `make test` (inside scripts/localpg.sh run,
# which provides PGLEASE_TEST_DSN): gofmt, go vet, build of the examples and
# the race-enabled test suite. Extra arguments go to `go test`.
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd -- "$ROOT"

step() { printf '\n== %s\n' "$*"; }

step "gofmt"
mapfile -t files < <("$ROOT/scripts/gofiles.sh")
if ((${#files[@]} > 0)); then
	unformatted="$(gofmt -l -- "${files[@]}")"
	if [[ -n "$unformatted" ]]; then
		echo "these files need gofmt (run 'make fmt'):" >&2
		while IFS= read -r f; do
			printf '  %s\n' "$f"
		done <<<"$unformatted" >&2
		exit 1
	fi
fi
echo "ok (${#files[@]} files)"

step "go vet ./..."
go vet ./...
echo "ok"

step "golangci-lint (scripts/lint.sh; .golangci.yml)"
"$ROOT/scripts/lint.sh"
echo "ok"

# The go tool skips directories starting with '_' in ./... and in
# ./_examples/..., so the examples are listed by hand: each directory with Go
# files, or each nested module (a go.mod of its own) built as a whole.
step "go build (examples)"
if [[ -d _examples ]]; then
	mapfile -t modroots < <(find _examples -name go.mod -type f -exec dirname {} \; | sort)
	pkgs=()
	while IFS= read -r dir; do
		inner=0
		for m in "${modroots[@]}"; do
			if [[ "$dir" == "$m" || "$dir" == "$m"/* ]]; then
				inner=1
				break
			fi
		done
		((inner)) || pkgs+=("./$dir")
	done < <(find _examples -name '*.go' -not -name '*_test.go' -type f -not -path '*/testdata/*' \
		-exec dirname {} \; | sort -u)
	if ((${#pkgs[@]} > 0)); then
		echo "go build ${pkgs[*]}"
		go build -o /dev/null "${pkgs[@]}"
	fi
	for m in "${modroots[@]}"; do
		echo "(cd $m && go build ./...)"
		(cd -- "$m" && go build -o /dev/null ./...)
	done
	if ((${#pkgs[@]} == 0 && ${#modroots[@]} == 0)); then
		echo "no Go files under _examples"
	fi
else
	echo "no _examples directory"
fi
echo "ok"

# The benchmarks are a module of their own (they depend on watermill-sql,
# which the library must not): vet them and run their tests. Their unit
# tests need no database; importtest (wmsqlimport.Run against the
# real watermill-sql v4) uses PGLEASE_TEST_DSN and fails without it.
if [[ -d benchmarks ]]; then
	step "benchmarks: go vet, go test"
	(cd benchmarks && go vet ./... && go test -count=1 ./...)
fi

# The tests' container start-up (when no PGLEASE_TEST_DSN is set and a
# Docker engine answers) is a module of its own, so that the library does
# not require testcontainers-go: vet it.
if [[ -d internal/pgtest/container ]]; then
	step "internal/pgtest/container: go vet"
	(cd internal/pgtest/container && go vet ./...)
fi

# The Prometheus exporter is a module of its own too (the library must not
# depend on the Prometheus client); its tests use PGLEASE_TEST_DSN.
if [[ -d metrics ]]; then
	step "metrics: go vet, go test -race"
	(cd metrics && go vet ./... && go test -race -count=1 -timeout 10m ./...)
fi

# The OpenTelemetry module is a module of its own (the library must not
# depend on OpenTelemetry); its tests use PGLEASE_TEST_DSN.
if [[ -d otel ]]; then
	step "otel: go vet, go test -race"
	(cd otel && go vet ./... && go test -race -count=1 -timeout 10m ./...)
fi

# The console of `pglease ui` in a real browser: Debian's chromium,
# headless, driven by chromedp from a module of its own (the library must
# not depend on chromedp). install-chromium.sh installs the browser when
# it is missing; the test builds and starts the real pglease command.
if [[ -d cmd/pglease/uitest ]]; then
	step "cmd/pglease/uitest: go vet, go test (pglease ui in headless chromium)"
	scripts/install-chromium.sh >/dev/null
	(cd cmd/pglease/uitest && go vet ./... && go test -count=1 -timeout 10m ./...)
fi

step "go test -race ./..."
if [[ -z "${PGLEASE_TEST_DSN:-}" ]]; then
	echo "note: PGLEASE_TEST_DSN is not set; run this through 'make test' (scripts/localpg.sh run)" >&2
fi
# -p 1: one package's test binary at a time. Tests restart the shared
# server (PGLEASE_TEST_RESTART_CMD), which would break the tests of any
# other package running at the same moment.
go test -race -count=1 -p 1 -timeout 40m "$@" ./...

# Behind PgBouncer in transaction mode (scripts/localpg.sh starts one): the
# tests of the Publisher, AckInTx/TxHandler, the Inspector, topics, delays,
# retention and groups again, with every pool of theirs going through it in
# pgx's simple protocol (their Subscribers LISTEN directly), and the
# command's tests with everything through it. The universal suite through
# PgBouncer is part of the race pass above (pooler_test.go).
if [[ -n "${PGLEASE_TEST_PGBOUNCER_DSN:-}" ]]; then
	bouncer_simple="$PGLEASE_TEST_PGBOUNCER_DSN"
	if [[ "$bouncer_simple" == *\?* ]]; then
		bouncer_simple+="&default_query_exec_mode=simple_protocol"
	else
		bouncer_simple+="?default_query_exec_mode=simple_protocol"
	fi
	step "go test -race, pools through PgBouncer (simple protocol)"
	PGLEASE_TEST_POOL_DSN="$bouncer_simple" go test -race -count=1 -timeout 10m \
		-run 'TestAckInTxCommitsWithTheTransaction|TestAckInTxBadInput|TestAckInTxIsFencedInTheDatabase|TestTxHandlerWithTheRouter|TestStaleOwnerAckInTxIsRefused|TestInspectorLagAfterKnownAcks|TestInspectorBadInput|TestCreateTopic|TestPublish|TestRequeue|TestDelayed|TestRetention|TestMaintainerIsOneSubscriber|TestPartitionedTopicOneSubscriber|TestNewSubscriberReceivesOldMessages|TestGroupSplitsTopicsEvenly' . ./admin
	step "cmd/pglease: go test -race through PgBouncer (simple protocol)"
	(cd cmd/pglease && PGLEASE_TEST_DSN="$bouncer_simple" go test -race -count=1 -timeout 10m .)
else
	echo "note: PGLEASE_TEST_PGBOUNCER_DSN is not set: the pooler tests of the race pass failed saying so" >&2
fi

# One Subscriber on 100,000 idle topics, without -race (the race detector
# adds its own memory per goroutine): all claimed, idle statements per second
# as for 10 topics, at most 8 KiB of Go memory per topic, Close releases all.
step "go test -run TestIdleTopicsCostNoWrites with 100,000 topics (without -race)"
PGLEASE_TEST_TOPICS=100000 go test -count=1 -timeout 10m -run 'TestIdleTopicsCostNoWrites' -v . | grep -E '^(--- |\s+--- |ok|FAIL|PASS)|idle topics'

# Watermill's TestReconnect shares a slice between two goroutines without
# synchronization, so under -race it is flagged whatever the backend; the
# race pass above skips it and it runs here, against a real restart of the
# test PostgreSQL (PGLEASE_TEST_RESTART_CMD).
step "go test -run TestPubSub/TestReconnect (without -race)"
# The filter keeps the suite's failure messages (Error Trace, Error,
# Messages, t.Errorf lines), so that a failure says why.
go test -count=1 -timeout 10m -run 'TestPubSub/TestReconnect' -v . |
	grep -E '^(=== RUN|--- |\s+--- |ok|FAIL|PASS)|server restarted|received in bulk read|Error( Trace)?:|Messages:|Test:|^\s+\S+_test\.go:[0-9]+:|test_(asserts|pubsub)\.go:[0-9]+'
