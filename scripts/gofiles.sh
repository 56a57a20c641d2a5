#!/usr/bin/env bash
# gofiles.sh: prints the project's Go files (tracked, plus new files git does
# not ignore), one per line, relative to the repository root. Includes
# _examples/. Outside a git checkout it falls back to find.
set -euo pipefail

ROOT="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/.." && pwd -P)"
cd -- "$ROOT"

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	# Deleted-but-tracked files would still be listed by --cached.
	git ls-files -z --cached --others --exclude-standard -- '*.go' |
		while IFS= read -r -d '' f; do
			[[ -f "$f" ]] && printf '%s\n' "$f"
		done
	exit 0
fi
find . -name '*.go' -type f -not -path './.git/*' -not -path './.tmp/*' | sed 's|^\./||' | sort
