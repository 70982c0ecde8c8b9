#!/usr/bin/env bash
# Lints ctrlhub's public API with buf: `buf lint` (STANDARD + COMMENTS rules,
# see proto/buf.yaml) and `buf format` (canonical layout, so diffs between
# API versions show only real changes). Exits non-zero on any finding.
#
# buf is installed from npm (@bufbuild/buf, a prebuilt binary) into a cache
# under the Cargo target directory on first use, pinned so that every machine
# lints with the same rules. Override with BUF=/path/to/buf.
#
# Usage: proto/lint.sh            (from anywhere)
set -euo pipefail

BUF_VERSION=1.75.0

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
target_dir="${CARGO_TARGET_DIR:-$repo_root/target}"
cache_dir="$target_dir/tools/buf-$BUF_VERSION"

buf="${BUF:-$cache_dir/node_modules/.bin/buf}"
if [[ ! -x "$buf" ]]; then
  if [[ -n "${BUF:-}" ]]; then
    echo "lint.sh: BUF=$BUF is not executable" >&2
    exit 2
  fi
  command -v npm >/dev/null || {
    echo "lint.sh: npm is needed to install buf (or set BUF=/path/to/buf)" >&2
    exit 2
  }
  echo "lint.sh: installing buf $BUF_VERSION into $cache_dir" >&2
  mkdir -p "$cache_dir"
  npm install --silent --no-audit --no-fund --prefix "$cache_dir" "@bufbuild/buf@$BUF_VERSION" >&2
fi

# buf resolves paths relative to the working directory; run from the root so
# that findings read proto/ctrlhub/v1/... like everything else in the repo.
cd "$repo_root"
"$buf" lint proto
"$buf" format --diff --exit-code proto
echo "lint.sh: buf $("$buf" --version) lint and format: OK" >&2
