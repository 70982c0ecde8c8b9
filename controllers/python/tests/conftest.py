"""Shared setup for the config-rollout tests.

Stub generation happens here, at import time, because the test modules import
rollout_controller (which imports the stubs) while pytest collects them.
"""

from __future__ import annotations

import sys
from pathlib import Path

CONTROLLER_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CONTROLLER_DIR))

import gen  # noqa: E402  (needs the path above)

# Generated code is not committed: regenerate from the proto on every run so the
# tests always exercise the current API.
gen.generate()

from rollout_support import devcluster  # noqa: E402,F401  (re-exported fixture)
