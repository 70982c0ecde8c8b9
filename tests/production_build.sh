#!/usr/bin/env bash
# The production image's build, as deploy/Dockerfile runs it: its `cargo build` line is taken
# from the Dockerfile and run verbatim (release, --locked, --no-default-features), and the
# binary it makes must have no `ctrlhub dev` subcommand and no devcluster or demo-controller
# code, and be at most 40 MB once stripped as the Dockerfile strips it. The dependency graph is
# checked first, since it fails in seconds.
#
# The release build is about 9 minutes of a cold test command on 2 cores.
# CTRLHUB_PRODUCTION_PROFILE=dev runs the same line without `--release` (the workspace build has
# compiled most of it already, about two minutes cold); the size check needs the release binary
# and is skipped then.
# CTRLHUB_PRODUCTION_PROFILE=check (what the test command runs) type-checks the same line with
# `cargo check` on clippy's artifacts, in seconds, and builds no binary. It proves the same
# property by construction: the dependency graph below has no devcluster, demo controller or
# SDK, so none can be linked and their strings cannot be in the binary; and the `dev`
# subcommand's arguments are a type of the `dev` module, which exists only with the `dev`
# feature, so a `dev` subcommand left in without the feature would not compile. The binary's
# own --help and refusal are checked by the dev and release forms.
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

# The one `RUN cargo build` line of the Dockerfile, continuation lines joined.
build=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' deploy/Dockerfile | sed -n 's/^RUN \(cargo build .*\)$/\1/p')
[[ $(grep -c . <<<"$build") -eq 1 ]] || fail "expected one 'RUN cargo build' line in deploy/Dockerfile, found: $build"
for flag in --release --locked --no-default-features; do
    grep -q -- "$flag" <<<"$build" || fail "the Dockerfile's build lacks $flag: $build"
done
case ${CTRLHUB_PRODUCTION_PROFILE:-release} in
    release) profile=release; run=$build ;;
    dev) profile=debug; run=${build/ --release/} ;;
    check)
        run=${build/cargo build --release/cargo check}
        echo "type-checking the Dockerfile's build: $run"
        eval "$run"
        grep -A1 -x '#\[cfg(feature = "dev")\]' manager/src/run/mod.rs | grep -qx 'pub mod dev;' \
            || fail "manager/src/run/mod.rs no longer gates 'pub mod dev;' behind the dev feature"
        echo "  ok: the Dockerfile's line compiles without the dev feature (no dev module, so no dev subcommand)"
        exit 0
        ;;
    *) fail "CTRLHUB_PRODUCTION_PROFILE must be release, dev or check, not '$CTRLHUB_PRODUCTION_PROFILE'" ;;
esac
echo "running the Dockerfile's build (${profile}): $run"
eval "$run"
[[ -x target/$profile/ctrlhub ]] || fail "target/$profile/ctrlhub was not built (the Dockerfile copies it from target/release)"
# The Dockerfile's strip line, on a copy: target/ stays as cargo left it.
strip_flags=$(sed -n 's|^RUN strip \(.*\) target/release/ctrlhub$|\1|p' deploy/Dockerfile)
[[ -n $strip_flags ]] || fail "expected a 'RUN strip ... target/release/ctrlhub' line in deploy/Dockerfile"
bin=target/production-check/ctrlhub
mkdir -p "$(dirname "$bin")"
cp "target/$profile/ctrlhub" "$bin"
if [[ $profile == debug ]]; then
    # target/debug/ctrlhub is the suites' binary, with `dev`: put it back (nothing to compile,
    # cargo links the workspace build's artifact again).
    cargo build --workspace --bins --quiet
fi
# shellcheck disable=SC2086 # the flags as the Dockerfile spells them
strip $strip_flags "$bin"
size_mb=$(( $(stat -c %s "$bin") / 1024 / 1024 ))
if [[ $profile == release ]]; then
    [[ $size_mb -le 40 ]] || fail "the image's binary is ${size_mb} MB (at most 40 MB expected)"
    echo "  ok: the image's binary is ${size_mb} MB after 'strip $strip_flags'"
else
    echo "  ok: stripped with 'strip $strip_flags' (${size_mb} MB unoptimised; the release build checks the image's size)"
fi

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

# devcluster's code would bring its own symbols and its fault-injection routes along.
for needle in devcluster memcached_controller /_devcluster/; do
    if grep -qa -- "$needle" "$bin"; then
        fail "the binary contains '$needle': devcluster or the demo controller is linked"
    fi
done
echo "  ok: no devcluster or memcached_controller code in $bin ($(du -h "$bin" | cut -f1))"

# The image's binary must also start and serve: rustc 1.95's release build once turned safe
# code in the gRPC server's set-up into a use-after-free that crashed `ctrlhub run` at start
# while every (debug) test passed. It runs against devcluster (the workspace build's, built
# here if missing) and must answer /healthz and still run five seconds later.
devcluster=target/debug/devcluster
[[ -x $devcluster ]] || cargo build --quiet --bin devcluster
state=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$state"' EXIT
free() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
"$devcluster" --listen "127.0.0.1:$(free)" --kubeconfig "$state/kubeconfig" >"$state/devcluster.log" 2>&1 &
for _ in $(seq 100); do [[ -s $state/kubeconfig ]] && break; sleep 0.1; done
http=$(free)
"$bin" run --kubeconfig "$state/kubeconfig" --grpc-addr "127.0.0.1:$(free)" --http-addr "127.0.0.1:$http" >"$state/ctrlhub.log" 2>&1 &
pid=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$http/healthz" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$http/healthz" >/dev/null || fail "'ctrlhub run' did not answer /healthz:
$(tail -5 "$state/ctrlhub.log")"
sleep 5
kill -0 "$pid" 2>/dev/null || fail "'ctrlhub run' stopped after starting:
$(tail -5 "$state/ctrlhub.log")"
echo "  ok: 'ctrlhub run' starts, answers /healthz and keeps running"
