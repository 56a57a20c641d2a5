#!/usr/bin/env bash
# lint.sh: golangci-lint (errcheck, staticcheck, revive, gocritic,
# ineffassign, unused; .golangci.yml) over every module of the project.
# Run by scripts/check.sh (`make test`) and `make lint`.
#
# The version is pinned here. When that version is not installed yet, it is
# built from the Go module proxy (`go install`, about two minutes on two
# cores) into a cache folder of its own, outside the repository, and reused
# from there: ${PGLEASE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pglease/tools}.
set -euo pipefail

VERSION="v2.15.0"

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
# Each module is linted on its own go.mod, not in the workspace (go.work).
export GOWORK=off
TOOLS="${PGLEASE_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/pglease/tools}"
BIN="$TOOLS/golangci-lint-$VERSION"

if [[ ! -x "$BIN/golangci-lint" ]]; then
	echo "lint: installing golangci-lint $VERSION into $BIN (go install, once)" >&2
	mkdir -p -- "$BIN"
	GOBIN="$BIN" GOFLAGS= go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$VERSION"
fi

# Each module on its own (the go tool's ./... stops at a nested go.mod),
# with the one configuration at the root.
mapfile -t modules < <(cd -- "$ROOT" && find . -name go.mod -not -path './.git/*' -not -path '*/testdata/*' \
	-exec dirname {} \; | sort)
status=0
for m in "${modules[@]}"; do
	echo "golangci-lint run $m/..."
	# --allow-parallel-runners: checkouts of one machine (git worktrees) may
	# lint at the same time; each waits for the others instead of failing.
	(cd -- "$ROOT/$m" && "$BIN/golangci-lint" run --allow-parallel-runners -c "$ROOT/.golangci.yml" ./...) || status=1
done
exit "$status"
