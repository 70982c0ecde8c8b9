"""Shared setup for the config-rollout tests. The controller runs on the ctrlhub SDK
(controllers/python-sdk), which must be installed: `pip install ./controllers/python-sdk`."""

from __future__ import annotations

import sys
from pathlib import Path

CONTROLLER_DIR = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(CONTROLLER_DIR))

from rollout_support import devcluster  # noqa: E402,F401  (re-exported fixture)
