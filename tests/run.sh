#!/usr/bin/env bash
# The project's test command: `bash tests/run.sh` (also what .ci/run executes).
#
# From a fresh clone it needs only the package registries. In order: the installs that need no
# Rust build start in the background (.venv for the Python suites, with ruff; the TypeScript
# SDK's npm install, build and unit tests; buf and the dashboards' schema check); the gates run
# (fmt, clippy, rustdoc, cargo deny, the production build check); the workspace and every test
# binary are built once; then the suites run side by side (the Rust suites, the SDK
# conformance matrix, the other crates' tests, the Python and TypeScript suites, the fuzz smoke
# run), and last, alone, the adversity suite, whose hostile-tenant checks measure latency.
# Each stage's output is on the terminal; each background job's in target/test-logs/NAME.log,
# whose last lines are printed if it fails.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's banner says how long the run has taken so far (the per-stage figures in notes).
STARTED=$SECONDS
elapsed() {
    printf '%dm%02ds' $(((SECONDS - STARTED) / 60)) $(((SECONDS - STARTED) % 60))
}
banner() {
    printf '\n==== %s ==== [%s]\n' "$*" "$(elapsed)"
}

# Jobs: stages that run beside others, each with its output in target/test-logs/NAME.log.
# The suites mostly wait (for leases, watches, processes they start), so on 2 cores several of
# them fit side by side; the timing-sensitive ones (the hostile-tenant, fault and stranger suites
# of the adversity binary) run alone at the end. `job NAME STEP...` starts the steps (shell
# functions or commands, one after another) in the background; `await_jobs NAME...` waits for
# them, prints each one's summary lines and time, and on a failure its log's last lines.
LOGS=target/test-logs
mkdir -p "$LOGS"
declare -A JOB_PID JOB_START
job() {
    local name=$1
    shift
    (
        set -euo pipefail
        started=$(date +%s)
        for step in "$@"; do
            printf '\n---- %s ----\n' "$step"
            eval "$step"
        done
        echo "---- $name took $(($(date +%s) - started))s"
    ) >"$LOGS/$name.log" 2>&1 &
    JOB_PID[$name]=$!
    JOB_START[$name]=$SECONDS
    echo "started $name in the background (log: $LOGS/$name.log)"
}
# A failed stage ends the run: the background jobs and what they started end with it.
kill_tree() {
    local child
    for child in $(pgrep -P "$1" || true); do kill_tree "$child"; done
    kill "$1" 2>/dev/null || true
}
trap 'for pid in "${JOB_PID[@]}"; do kill_tree "$pid"; done' EXIT
await_jobs() {
    local name failed=()
    for name in "$@"; do
        if wait "${JOB_PID[$name]}"; then
            printf '%s passed (%s) [%s]\n' "$name" "$(sed -n "s/^---- $name took /took /p" "$LOGS/$name.log")" "$(elapsed)"
            grep -E '^(test result:|[0-9]+ passed|# (pass|fail) |.*: Done [0-9]+ runs|installed: |API docs: )' "$LOGS/$name.log" | sed 's/^/    /' || true
        else
            printf '%s FAILED after %ds [%s]; the end of %s:\n' "$name" $((SECONDS - JOB_START[$name])) "$(elapsed)" "$LOGS/$name.log"
            tail -80 "$LOGS/$name.log" | sed 's/^/    /'
            failed+=("$name")
        fi
    done
    if [[ ${#failed[@]} -gt 0 ]]; then
        echo "FAILED: ${failed[*]} (full logs in $LOGS/)"
        exit 1
    fi
}

# Gates first, so a formatting slip or a lint fails in minutes, not after the suites.
# Installs and checks that need no Rust build start now, beside the compiler.
python_env() {
    if [[ ! -x .venv/bin/python ]]; then
        echo "creating .venv with $(python3 --version)"
        python3 -m venv .venv
    fi
    # One requirements file covers both Python suites (the devcluster client suite and the
    # example controller); pip is quick when everything is already satisfied.
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r controllers/python/requirements.txt
    echo "installed: $(.venv/bin/python -c 'import pytest, kubernetes, grpc; print("pytest", pytest.__version__, "/ kubernetes", kubernetes.__version__, "/ grpcio", grpc.__version__)')"
    # The Python SDK (controllers/python-sdk, `import ctrlhub`): pip builds it from source, which
    # generates its gRPC stubs from proto/ with grpcio-tools; the extras add OpenTelemetry and the
    # tools of its own test suite (pytest-asyncio, trustme, mypy, pdoc).
    .venv/bin/python -m pip install --quiet --disable-pip-version-check './controllers/python-sdk[otel,test]'
    echo "installed: the Python SDK into .venv"
    # ruff check: every Python file (ruff.toml).
    .venv/bin/ruff check .
}
# The TypeScript SDK (controllers/typescript-sdk): npm ci, the wire types generated from proto/
# with buf (from npm), tsc, the TSDoc API docs check and the unit tests; its integration tests,
# which start the devcluster and ctrlhub binaries, run with the suites below.
typescript_build() {
    cd controllers/typescript-sdk
    npm ci --no-audit --no-fund --loglevel=error
    npm run build
    npm run docs:check
    npm run test:unit
}
job python-env python_env
job typescript-build typescript_build
# buf lint (proto/ctrlhub/v1), and the Grafana dashboards against Grafana's own schema
# (@grafana/schema from npm; the Prometheus test below runs every panel's query).
job proto-and-dashboards "bash proto/lint.sh" "bash dashboards/schema/check.sh"

# Gates first, so a formatting slip or a lint fails in minutes, not after the suites.
banner "cargo fmt --check"
cargo fmt --all --check

banner "cargo clippy --workspace --all-targets -- -D warnings"
cargo clippy --workspace --all-targets -- -D warnings

banner "cargo doc --no-deps --workspace (rustdoc warnings are errors)"
RUSTDOCFLAGS=-Dwarnings cargo doc --no-deps --workspace

banner "cargo deny: licences, bans and sources of every crate (deny.toml)"
# Advisories are not checked here: the RustSec database lives on GitHub, which this machine
# cannot reach (deny.toml says how to run them elsewhere). Duplicate versions are warnings, shown
# with --log-level warn.
if ! command -v cargo-deny >/dev/null 2>&1; then
    echo "installing cargo-deny (cargo install --locked; several minutes, once per machine)..."
    cargo install cargo-deny --locked
fi
# --offline reads crates from the local registry; cargo fetch puts every platform's there first.
cargo fetch --quiet
cargo deny --offline --log-level error check --hide-inclusion-graph licenses bans sources

banner "production build check: the Dockerfile's cargo command type-checked; no devcluster, demo controller or \`dev\` subcommand"
# `cargo check` of the Dockerfile's line on clippy's artifacts (seconds) and its dependency
# graph; tests/production_build.sh says why that proves what the image links and refuses. The
# built forms (dev profile: about 2 minutes cold; release with the image's 40 MB size check: 9)
# are in docs/testing.md, "Release checks".
CTRLHUB_PRODUCTION_PROFILE=check bash tests/production_build.sh

banner "Debian packages (prometheus + promtool, chromium)"
# prometheus: promtool checks metrics and rules, and the real server runs every dashboard query.
# chromium: the status page test drives it headless.
missing=()
command -v promtool >/dev/null && command -v prometheus >/dev/null || missing+=(prometheus)
command -v chromium >/dev/null || missing+=(chromium)
if [[ ${#missing[@]} -eq 0 ]]; then
    echo "already installed: $(prometheus --version 2>&1 | head -1); $(chromium --version 2>/dev/null | head -1)"
else
    echo "installing ${missing[*]} with apt-get (a few minutes on a fresh machine)..."
    SUDO=""
    if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    echo "installed: $(prometheus --version 2>&1 | head -1); $(chromium --version 2>/dev/null | head -1)"
fi

banner "cargo build --workspace --bins, then every test binary (cargo test --no-run)"
cargo build --workspace --bins
cargo test --workspace --no-run --quiet

banner "installs and checks begun at the start: .venv and ruff, the TypeScript build, buf lint, dashboards"
await_jobs python-env typescript-build proto-and-dashboards

banner "the suites, side by side: Rust suites, SDK conformance matrix, other crates, Python, TypeScript, fuzz"
# Every cargo command below selects the whole workspace, as the build above did: selecting one
# package (-p) resolves its dependencies' features differently, and cargo would compile them
# again. Integration test binaries are chosen by name instead: the end-to-end suites of
# ctrlhub-tests in one job, the conformance matrix in another, adversity alone at the end, and
# every other test binary of the workspace (cargo metadata lists them, so a new one is never
# left out) in a third.
SUITES=(manager devcluster artifacts)
ALONE=adversity
mapfile -t OTHERS < <(cargo metadata --no-deps --format-version 1 | python3 -c '
import json, sys
named = set(sys.argv[1:])
for package in json.load(sys.stdin)["packages"]:
    for target in package["targets"]:
        if "test" in target["kind"] and target["name"] not in named:
            print(target["name"])
' "${SUITES[@]}" conformance "$ALONE")
tests_named() {
    local name args=()
    for name in "$@"; do args+=(--test "$name"); done
    echo "${args[@]}"
}
rust_suites() {
    # shellcheck disable=SC2046 # one word per flag
    cargo test --workspace --lib --bins $(tests_named "${SUITES[@]}")
    # The contract again with every manager a ring of one (`CTRLHUB_MODE=ring`, which the
    # harness passes on): ring mode must keep every guarantee leader mode gives, except the
    # leader row itself, which ring mode replaces with single owner (tests/tests/manager/ring.rs).
    CTRLHUB_MODE=ring cargo test --workspace --test manager -- contract:: --skip contract_single_leader
    cargo test --workspace --doc
}
python_suites() {
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/python controllers/python/tests
}
# Every SDK of tests/conformance/sdks.json against real managers and devcluster; needs the
# binaries and .venv above. Prints each column's red rows; logs in target/conformance/<sdk>/.
# README.md's table must match (tests/conformance/README.md).
conformance() {
    cargo test --workspace --test conformance -- --nocapture
}
# The Python SDK on real managers (its own pytest configuration: asyncio mode, one event loop;
# mypy --strict), then its API reference as HTML from its docstrings and type hints.
python_sdk() {
    (cd controllers/python-sdk && ../../.venv/bin/python -m pytest -q -p no:cacheprovider tests)
    .venv/bin/python -m pdoc --docformat google -o target/python-sdk-docs ctrlhub
    echo "API docs: target/python-sdk-docs/ctrlhub.html"
}
# The other crates' test binaries (the Rust SDK's suites, the bench smoke test), then the
# TypeScript SDK's integration tests.
other_tests() {
    [[ ${#OTHERS[@]} -gt 0 ]] || { echo "no other test binaries in the workspace?" >&2; return 1; }
    echo "test binaries: ${OTHERS[*]}"
    # shellcheck disable=SC2046 # one word per flag
    cargo test --workspace $(tests_named "${OTHERS[@]}")
}
typescript_integration() {
    cd controllers/typescript-sdk
    npm run test:integration
}
# The fuzz smoke run (fuzz/: 5 targets, dev profile, fixed seed, stable toolchain via
# RUSTC_BOOTSTRAP): builds the fuzz package in fuzz/target with libFuzzer instrumentation
# (cargo-fuzz is installed on first use) and runs each target for 20,000 inputs (FUZZ_RUNS and
# FUZZ_PROFILE change that). Niced: it builds with the CPU the waiting suites leave.
fuzz_smoke() {
    nice -n 19 bash fuzz/smoke.sh
}
job rust-suites rust_suites python_suites python_sdk
job conformance conformance
job other-crates other_tests typescript_integration
job fuzz fuzz_smoke
await_jobs rust-suites conformance other-crates fuzz

banner "cargo test --workspace --test adversity (hostile tenants, faults, strangers; alone, as it measures latency)"
cargo test --workspace --test "$ALONE"

banner "all stages passed"
