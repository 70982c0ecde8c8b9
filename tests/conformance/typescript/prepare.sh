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

# The SDK is built again only when a source is newer than its build: the test command builds it
# first, and its integration tests run from its dist/ while this column runs beside them (a
# build starts by deleting dist/).
stale() {
    local built="$sdk/dist/src/index.js"
    [[ ! -f $built ]] && return 0
    [[ -n $(find "$sdk/src" "$sdk/test" "$sdk/examples" "$sdk/fixtures" "$sdk/package.json" \
        "$sdk/package-lock.json" "$sdk/tsconfig.json" "$here/../../../proto" -newer "$built" -print -quit) ]]
}
if stale; then
    (cd "$sdk" && install && npm run --silent build)
fi
cd "$here" && install && npm run --silent build
