#!/usr/bin/env bash
# The `prepare` step of the python column (tests/conformance/sdks.json): installs the Python SDK
# (controllers/python-sdk) into .venv, unless the installed copy is newer than every source of
# it. The test command installs it first, and other suites import it from .venv while this
# column runs beside them: a reinstall removes its files for a moment.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)"
py="$root/.venv/bin/python"
sdk="$root/controllers/python-sdk"
installed=$("$py" -c 'import importlib.util; s = importlib.util.find_spec("ctrlhub"); print(s.origin if s and s.origin else "")')
if [[ -z $installed || $installed == "$sdk"/* ]] \
    || [[ -n $(find "$sdk/src" "$sdk/pyproject.toml" "$sdk/hatch_build.py" "$root/proto" -type f -not -path "*/__pycache__/*" -newer "$installed" -print -quit) ]]; then
    "$py" -m pip install --quiet --disable-pip-version-check "$sdk"
fi
