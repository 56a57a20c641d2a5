#!/usr/bin/env bash
# check.sh: the checks of `make test` (and CI), run inside localpg
# (internal/cmd/localpg run), which provides PGLEASE_TEST_DSN,
# PGLEASE_TEST_RESTART_CMD and PGLEASE_TEST_PGBOUNCER_DSN. The programs they
# run that Go does not bring (PostgreSQL's, PgBouncer, Chromium) are
# installed beforehand by scripts/install-deps.sh.
#
# Usage: scripts/check.sh [STEP...]
#   Without a STEP, every step of ALL_STEPS, in that order (make test).
#   Steps:
#     gofmt       gofmt -l over every Go file
#     goversion   every module's go directive at most the README's "Go X.Y
#                 or later", and the library, otel and metrics modules
#                 vetted with that Go (GOTOOLCHAIN=goX.Y.0, fetched by the
#                 go command from the module proxy on first use)
#     vet         go vet ./...
#     lint        golangci-lint over every module (scripts/lint.sh)
#     examples    go build of _examples
#     benchmarks  go vet and go test of the benchmarks module
#     container   go vet of internal/pgtest/container
#     metrics     go vet and go test -race of the metrics module
#     otel        go vet and go test -race of the otel module
#     ui          the browser test of `pglease ui` (make test-ui)
#     race        go test -race ./..., one package at a time
#     pgbouncer   the tests of the library and of the command again with
#                 their pools through PgBouncer in transaction mode
#     idle        one Subscriber on 100,000 idle topics, without -race
#     reconnect   Watermill's TestReconnect, without -race, against a real
#                 restart of the server
#     pooler      the PgBouncer tests of the race pass alone (make
#                 test-pgbouncer; not in ALL_STEPS, which runs them in race)
#     server      the tests of what depends on the server's version (make
#                 test-server PG=17; not in ALL_STEPS, whose race pass runs
#                 them all): SERVER_TESTS of the root package, and the
#                 packages of SERVER_PKGS whole
set -euo pipefail

ALL_STEPS=(gofmt goversion vet lint examples benchmarks container metrics otel ui race pgbouncer idle reconnect)

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd -- "$ROOT"

# Each module is checked on its own go.mod, not with the versions that the
# workspace (go.work) picks for all the modules together.
export GOWORK=off

step() { printf '\n== %s\n' "$*"; }

step_gofmt() {
	step "gofmt"
	local files unformatted
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
}

# The oldest Go the README names ("Go 1.25 or later") is what every
# module's go directive may ask at most: a higher one raises the go
# directive of a user's module on `go get`. The modules users import are
# vetted (built with their tests) with that Go itself.
step_goversion() {
	local want mods=() m v bad=0
	want="$(sed -n 's/^- Go \([0-9][0-9.]*\) or later.*/\1/p' README.md | head -1)"
	if [[ -z "$want" ]]; then
		echo "README.md names no \"Go X.Y or later\" line" >&2
		exit 1
	fi
	step "go directives at most $want (README), vet with go$want.0"
	mapfile -t mods < <(find . -name go.mod -not -path './.git/*' -not -path '*/testdata/*' -not -path './.tmp/*' | sort)
	for m in "${mods[@]}"; do
		v="$(sed -n 's/^go \([0-9.]*\).*/\1/p' "$m")"
		if [[ "$(printf '%s\n%s.0\n' "$v" "$want" | sort -V | tail -1)" != "$want.0" && "$v" != "$want" ]]; then
			echo "$m: go $v, above the README's Go $want" >&2
			bad=1
		fi
	done
	((bad == 0)) || exit 1
	echo "ok (${#mods[@]} modules)"
	for m in . otel metrics; do
		echo "(cd $m && GOTOOLCHAIN=go$want.0 go vet ./...)"
		(cd -- "$m" && GOTOOLCHAIN="go$want.0" go vet ./...)
	done
	echo "ok"
}

step_vet() {
	step "go vet ./..."
	go vet ./...
	echo "ok"
}

step_lint() {
	step "golangci-lint (scripts/lint.sh; .golangci.yml)"
	"$ROOT/scripts/lint.sh"
	echo "ok"
}

# The go tool skips directories starting with '_' in ./... and in
# ./_examples/..., so the examples are listed by hand: each directory with Go
# files, or each nested module (a go.mod of its own) built as a whole.
step_examples() {
	step "go build (examples)"
	if [[ ! -d _examples ]]; then
		echo "no _examples directory"
		return
	fi
	local modroots pkgs=() dir inner m
	mapfile -t modroots < <(find _examples -name go.mod -type f -exec dirname {} \; | sort)
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
	echo "ok"
}

# The benchmarks are a module of their own (they depend on watermill-sql,
# which the library must not): vet them and run their tests. Their unit
# tests need no database; importtest (wmsqlimport.Run against the
# real watermill-sql v4) uses PGLEASE_TEST_DSN.
step_benchmarks() {
	step "benchmarks: go vet, go test"
	(cd benchmarks && go vet ./... && go test -count=1 ./...)
}

# The tests' container start-up (when no PGLEASE_TEST_DSN is set and a
# Docker engine answers) is a module of its own, so that the library does
# not require testcontainers-go: vet it.
step_container() {
	step "internal/pgtest/container: go vet"
	(cd internal/pgtest/container && go vet ./...)
}

# The Prometheus exporter is a module of its own too (the library must not
# depend on the Prometheus client); its tests use PGLEASE_TEST_DSN.
step_metrics() {
	step "metrics: go vet, go test -race"
	(cd metrics && go vet ./... && go test -race -count=1 -timeout 10m ./...)
}

# The OpenTelemetry module is a module of its own (the library must not
# depend on OpenTelemetry); its tests use PGLEASE_TEST_DSN.
step_otel() {
	step "otel: go vet, go test -race"
	(cd otel && go vet ./... && go test -race -count=1 -timeout 10m ./...)
}

# The console of `pglease ui` in a real browser: Debian's chromium,
# headless, driven by chromedp from a module of its own (the library must
# not depend on chromedp). The test builds and starts the real pglease
# command.
step_ui() {
	step "cmd/pglease/uitest: go vet, go test (pglease ui in headless chromium)"
	(cd cmd/pglease/uitest && go vet ./... && go test -count=1 -timeout 10m ./...)
}

step_race() {
	step "go test -race ./..."
	if [[ -z "${PGLEASE_TEST_DSN:-}" ]]; then
		echo "note: PGLEASE_TEST_DSN is not set; run this through 'make test' (localpg run)" >&2
	fi
	# -p 1: one package's test binary at a time. Tests restart the shared
	# server (PGLEASE_TEST_RESTART_CMD), which would break the tests of any
	# other package running at the same moment.
	go test -race -count=1 -p 1 -timeout 40m ./...
}

# The tests that need PgBouncer (pooler_test.go: the universal suite
# through it; internal/pgtest: it survives a restart of the server), which
# the race pass runs too.
step_pooler() {
	step "go test -race, the PgBouncer tests"
	go test -race -count=1 -timeout 10m -run 'PgBouncer|TestCheckDirect' .
	go test -race -count=1 -timeout 10m -run 'PgBouncer|TestConnectAndRestart' ./internal/pgtest
}

# What pglease takes from the server that changes between major versions:
# snapshots and xid8, the identity read from the WAL position, the
# postmaster's start time and the statistics' reset time (failover, crash
# recovery, a restart), pg_locks and advisory locks, partition DDL,
# LISTEN/NOTIFY (through PgBouncer too), roles and grants, the planner on
# the messages index. CI runs these on every version but the one of `make
# test` (.ci/run).
SERVER_TESTS='TestPubSub|Failover|Crash|ExactlyOnce|AckInTx|TxHandler|TestStaleOwner|PgBouncer|TestCheckDirect|TestPollOnly|TestListener|TestSchemaSetUp|TestUpgrade|TestLeastPrivilegeRole|TestMaintainerWithoutGrantsStandsAside|TestMaintainerFunctions|TestGrantSQL|TestSetUpByAnApplicationRole|TestPublisherOnlyRole|TestMigrat|TestRuntimeRunsNothing|TestMultiByteTableNames|TestForgedNotifications|TestRefusedRelease|TestDatabaseRestart|TestTerminatedConnections|TestPartition|TestRetention|TestIdlePoll|TestHotTables|TestMaintainerElection'
SERVER_PKGS=(./internal/pgsql ./internal/pgrepl ./internal/pgtest ./admin)

step_server() {
	step "go test -race, the root package's tests that depend on the server's version"
	go test -race -count=1 -timeout 30m -run "$SERVER_TESTS" .
	step "go test -race ${SERVER_PKGS[*]}"
	go test -race -count=1 -p 1 -timeout 20m "${SERVER_PKGS[@]}"
}

# Behind PgBouncer in transaction mode (localpg starts one): the tests of
# the Publisher, AckInTx/TxHandler, the Inspector, topics, delays,
# retention and groups again, with every pool of theirs going through it in
# pgx's simple protocol (their Subscribers LISTEN directly), and the
# command's tests with everything through it. The universal suite through
# PgBouncer is part of the race pass (pooler_test.go).
step_pgbouncer() {
	if [[ -z "${PGLEASE_TEST_PGBOUNCER_DSN:-}" ]]; then
		echo "note: PGLEASE_TEST_PGBOUNCER_DSN is not set: the pooler tests of the race pass failed saying so" >&2
		return
	fi
	local bouncer_simple="$PGLEASE_TEST_PGBOUNCER_DSN"
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
}

# One Subscriber on 100,000 idle topics, without -race (the race detector
# adds its own memory per goroutine): all claimed, idle statements per second
# as for 10 topics, at most 8 KiB of Go memory per topic, Close releases all.
step_idle() {
	step "go test -run TestIdleTopicsCostNoWrites with 100,000 topics (without -race)"
	PGLEASE_TEST_TOPICS=100000 go test -count=1 -timeout 10m -run 'TestIdleTopicsCostNoWrites' -v . | grep -E '^(--- |\s+--- |ok|FAIL|PASS)|idle topics'
}

# Watermill's TestReconnect shares a slice between two goroutines without
# synchronization, so under -race it is flagged whatever the backend; the
# race pass skips it and it runs here, against a real restart of the test
# PostgreSQL (PGLEASE_TEST_RESTART_CMD).
step_reconnect() {
	step "go test -run TestPubSub/TestReconnect (without -race)"
	# The filter keeps the suite's failure messages (Error Trace, Error,
	# Messages, t.Errorf lines), so that a failure says why.
	go test -count=1 -timeout 10m -run 'TestPubSub/TestReconnect' -v . |
		grep -E '^(=== RUN|--- |\s+--- |ok|FAIL|PASS)|server restarted|received in bulk read|Error( Trace)?:|Messages:|Test:|^\s+\S+_test\.go:[0-9]+:|test_(asserts|pubsub)\.go:[0-9]+'
}

steps=("$@")
if ((${#steps[@]} == 0)); then
	steps=("${ALL_STEPS[@]}")
fi
for s in "${steps[@]}"; do
	if [[ "$(type -t "step_$s")" != function ]]; then
		echo "check.sh: no step '$s'; steps: ${ALL_STEPS[*]} pooler" >&2
		exit 2
	fi
done
for s in "${steps[@]}"; do
	"step_$s"
done
