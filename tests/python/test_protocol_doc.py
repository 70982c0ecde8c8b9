"""docs/protocol.md's recorded session stays true: the recording script (a raw grpcio controller
built only from proto/) runs again against a fresh manager, and the session must go exactly as
the document shows it, message by message, up to ids, uuids and timestamps."""

from __future__ import annotations

import re
import subprocess
import sys

from test_grpc_ecosystem import REPO, ctrlhub_binary, manager

SHAPE = [
    (re.compile(r'"transcript-[0-9a-f-]{36}"'), '"<session>"'),
    (re.compile(r"seconds: \d+ nanos: \d+"), "<timestamp>"),
]


def shape(text: str) -> list[str]:
    lines = [line for line in text.splitlines() if line.startswith(("→", "←"))]
    for pattern, replacement in SHAPE:
        lines = [pattern.sub(replacement, line) for line in lines]
    return lines


def documented() -> list[str]:
    doc = (REPO / "docs" / "protocol.md").read_text()
    block = doc.split("## A real session", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    return shape(block)


def test_the_documented_session_replays(devcluster, tmp_path):
    assert ctrlhub_binary().exists(), "run `cargo build --workspace --bins` first"
    # The identity `ctrlhub dev` uses, as in the recording.
    with manager(devcluster.kubeconfig, "ctrlhub-dev", tmp_path) as address:
        run = subprocess.run(
            [sys.executable, str(REPO / "docs" / "session_transcript.py"),
             "--addr", address, "--token", "dev", "--kubeconfig", str(devcluster.kubeconfig)],
            capture_output=True, text=True, timeout=120, check=False,
        )
    assert run.returncode == 0, run.stderr
    recorded = shape(run.stdout)
    expected = documented()
    assert recorded == expected, "\n".join(["recorded:", *recorded, "documented:", *expected])
