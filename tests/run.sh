#!/usr/bin/env bash
# The project's test command: `bash tests/run.sh` (also what .ci/run executes).
#
# From a fresh clone it needs only the package registries: it creates .venv for the
# Python conformance suite, builds the workspace binaries (the Python suite runs the
# devcluster binary), runs every Rust test, then the Python suite.
set -euo pipefail
cd "$(dirname "$0")/.."

banner() {
    printf '\n==== %s ====\n' "$*"
}

banner "Debian packages (promtool from prometheus)"
if command -v promtool >/dev/null; then
    echo "promtool already installed: $(promtool --version 2>&1 | head -1)"
else
    echo "installing prometheus (for promtool) with apt-get..."
    SUDO=""
    if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
    echo "installed: $(promtool --version 2>&1 | head -1)"
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

banner "buf lint (proto/ctrlhub/v1)"
bash proto/lint.sh

banner "cargo build --workspace --bins"
cargo build --workspace --bins

banner "cargo test --workspace"
cargo test --workspace

banner "pytest tests/python controllers/python/tests"
.venv/bin/python -m pytest -q -p no:cacheprovider tests/python controllers/python/tests
