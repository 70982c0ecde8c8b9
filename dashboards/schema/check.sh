#!/usr/bin/env bash
# Every dashboard in dashboards/grafana against Grafana's published dashboard schema
# (@grafana/schema, pinned with TypeScript in package-lock.json), then proof that the check can
# fail: a dashboard with an unknown field and a wrong value must be refused.
set -euo pipefail
cd "$(dirname "$0")"
if [[ ! -d node_modules/@grafana/schema || package-lock.json -nt node_modules/.package-lock.json ]]; then
    echo "installing @grafana/schema and typescript (npm ci)..."
    npm ci --no-audit --no-fund --loglevel=error
fi
node check.mjs ../grafana/*.json

broken=$(mktemp --suffix=.json)
trap 'rm -f "$broken"' EXIT
# Each case breaks the overview dashboard in one way, which the check must name.
for case in 'd.refresh_every = "5s"|refresh_every' 'd.panels[0].gridPos.w = "wide"|not assignable to type .number' \
    'd.panels.find((p) => p.fieldConfig).fieldConfig.defaults.thresholds.mode = "relative"|"relative"'; do
    change=${case%%|*}
    expect=${case#*|}
    node -e "
const fs = require('fs');
const d = JSON.parse(fs.readFileSync(process.argv[1], 'utf8'));
$change;
fs.writeFileSync(process.argv[2], JSON.stringify(d, null, 2));
" ../grafana/ctrlhub-overview.json "$broken"
    if out=$(node check.mjs "$broken" 2>&1); then
        echo "the schema check accepted a broken dashboard ($change):" >&2
        echo "$out" >&2
        exit 1
    fi
    grep -q -- "$expect" <<<"$out" || {
        echo "the schema check refused ($change) without naming it ($expect):" >&2
        echo "$out" >&2
        exit 1
    }
    echo "ok: refused a dashboard with $change"
done
