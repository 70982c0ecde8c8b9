#!/usr/bin/env bash
# The production build (what deploy/Dockerfile builds: `--no-default-features`) has no `ctrlhub
# dev` subcommand and links neither devcluster (the in-memory API server with its fault-injection
# endpoints) nor the demo controller. Debug profile in the shared target dir, so it reuses the
# test build's dependencies; the default binary is rebuilt at the end because the end-to-end
# tests run `ctrlhub dev` from target/debug.
set -euo pipefail
cd "$(dirname "$0")/.."

fail() {
    echo "production build check FAILED: $*" >&2
    exit 1
}

echo "checking the dependency graph of ctrlhub --no-default-features..."
tree=$(cargo tree -p ctrlhub --no-default-features -e normal --prefix none)
for crate in devcluster memcached-controller ctrlhub-sdk; do
    if grep -q "^$crate " <<<"$tree"; then
        fail "$crate is linked into the production binary"
    fi
done
echo "  ok: no devcluster, memcached-controller or ctrlhub-sdk"

echo "building ctrlhub --no-default-features (debug)..."
cargo build -q -p ctrlhub --no-default-features --bin ctrlhub
bin="target/production-check/ctrlhub"
mkdir -p "$(dirname "$bin")"
cp target/debug/ctrlhub "$bin"
trap 'echo "restoring the default (dev) build of ctrlhub..."; cargo build -q -p ctrlhub --bin ctrlhub' EXIT

help=$("$bin" --help)
grep -qE '^  run ' <<<"$help" || fail "'ctrlhub --help' does not list 'run':
$help"
if grep -qE '^  dev ' <<<"$help"; then
    fail "'ctrlhub --help' lists 'dev':
$help"
fi
echo "  ok: --help lists run and not dev"

set +e
out=$("$bin" dev 2>&1)
code=$?
set -e
[[ $code -ne 0 ]] || fail "'ctrlhub dev' exited 0"
grep -q "unrecognized subcommand 'dev'" <<<"$out" || fail "'ctrlhub dev' did not fail as an unknown subcommand:
$out"
echo "  ok: 'ctrlhub dev' is refused as an unrecognized subcommand (exit $code)"
