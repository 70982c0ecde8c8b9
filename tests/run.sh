#!/usr/bin/env bash
# The project's test command: `bash tests/run.sh` (also what .ci/run executes).
#
# From a fresh clone it needs only the package registries: it creates .venv for the
# Python conformance suite, builds the workspace binaries (the Python suite runs the
# devcluster binary), installs and tests the TypeScript SDK with npm, runs every Rust test,
# the SDK conformance matrix (whose python-raw and python columns run in .venv and the
# typescript column on the npm install), then the Python suites.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each stage's banner says how long the run has taken so far (the per-stage figures in notes).
STARTED=$SECONDS
banner() {
    printf '\n==== %s ==== [%dm%02ds]\n' "$*" $(((SECONDS - STARTED) / 60)) $(((SECONDS - STARTED) % 60))
}

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

banner "python environment (.venv)"
if [[ ! -x .venv/bin/python ]]; then
    echo "creating .venv with $(python3 --version)"
    python3 -m venv .venv
fi
# One requirements file covers both Python suites (the devcluster client suite and the
# example controller); pip is quick when everything is already satisfied.
echo "installing Python test dependencies into .venv (quiet)..."
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r controllers/python/requirements.txt
echo "installed: $(.venv/bin/python -c 'import pytest, kubernetes, grpc; print("pytest", pytest.__version__, "/ kubernetes", kubernetes.__version__, "/ grpcio", grpc.__version__)')"
# The Python SDK (controllers/python-sdk, `import ctrlhub`): pip builds it from source, which
# generates its gRPC stubs from proto/ with grpcio-tools; the extras add OpenTelemetry and the
# tools of its own test suite (pytest-asyncio, trustme, mypy, pdoc).
echo "installing the Python SDK into .venv (quiet)..."
.venv/bin/python -m pip install --quiet --disable-pip-version-check './controllers/python-sdk[otel,test]'

banner "ruff check (every Python file; ruff.toml)"
.venv/bin/ruff check .

banner "buf lint (proto/ctrlhub/v1)"
bash proto/lint.sh

banner "Grafana dashboards against Grafana's own schema (@grafana/schema, npm)"
# Installs @grafana/schema and TypeScript from dashboards/schema/package-lock.json on first use;
# the Prometheus test below runs every panel's query.
bash dashboards/schema/check.sh

banner "cargo build --workspace --bins"
cargo build --workspace --bins

banner "TypeScript SDK (controllers/typescript-sdk): npm ci, build, typedoc check, node:test"
# Generates the wire types from proto/ with buf (from npm), compiles with tsc, checks the TSDoc
# API docs, then runs the unit tests and the integration tests, which start the devcluster and
# ctrlhub binaries built above. The conformance matrix below builds on this install.
(cd controllers/typescript-sdk && npm ci --no-audit --no-fund --loglevel=error && npm test)

banner "production build (dev profile): the Dockerfile's cargo command; no \`dev\` subcommand, no devcluster or demo controller linked"
# The same line without --release proves what the image links and refuses, on the workspace
# build's dependencies (under a minute: their feature sets are equal, see rand in Cargo.toml).
# The release build itself and the image's 40 MB size check take 9 minutes of a cold run on
# 2 cores: \`bash tests/production_build.sh\` runs them
# (docs/testing.md: "Release checks").
CTRLHUB_PRODUCTION_PROFILE=dev bash tests/production_build.sh

banner "cargo test --workspace (the SDK conformance matrix runs next, on its own)"
cargo test --workspace -- --skip conformance_matrix

banner "SDK conformance matrix (tests/conformance/README.md; README.md's table must match)"
# Every SDK of tests/conformance/sdks.json against real managers and devcluster; needs the
# binaries and .venv above. Prints each column's red rows; logs in target/conformance/<sdk>/.
cargo test -p ctrlhub-tests --test conformance -- --nocapture

banner "cargo fuzz smoke run (fuzz/: 5 targets, dev profile, fixed seed, stable toolchain via RUSTC_BOOTSTRAP)"
# Builds the fuzz package in fuzz/target with libFuzzer instrumentation (cargo-fuzz is
# installed on first use) and runs each target for 20,000 inputs; FUZZ_RUNS and FUZZ_PROFILE change that.
bash fuzz/smoke.sh

banner "pytest tests/python controllers/python/tests"
.venv/bin/python -m pytest -q -p no:cacheprovider tests/python controllers/python/tests

banner "pytest controllers/python-sdk/tests (the Python SDK on real managers; mypy --strict), pdoc"
# Its own pytest configuration (pyproject.toml: asyncio mode, one event loop), hence its own run.
(cd controllers/python-sdk && ../../.venv/bin/python -m pytest -q -p no:cacheprovider tests)
# The SDK's API reference as HTML, from its docstrings and type hints.
.venv/bin/python -m pdoc --docformat google -o target/python-sdk-docs ctrlhub
echo "API docs: target/python-sdk-docs/ctrlhub.html"

banner "all stages passed"
