#!/usr/bin/env bash
# The `prepare` step of the typescript column (tests/conformance/sdks.json): installs and
# builds @ctrlhub/sdk (generating its wire types from proto/), then this controller. npm ci
# runs only when node_modules is missing or older than the lock file.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
sdk="$here/../../../controllers/typescript-sdk"

install() {
    if [[ ! -d node_modules || package-lock.json -nt node_modules/.package-lock.json ]]; then
        npm ci --no-audit --no-fund --loglevel=error
    fi
}

cd "$sdk" && install && npm run --silent build
cd "$here" && install && npm run --silent build
