"""The README's install lines, run verbatim in a fresh project: a new virtualenv (the
repository's .venv is not on the PATH) installing the SDK from a read-only copy of the
repository, as a read-only clone or a vendored checkout would be. Needs PyPI (as pip does)."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

from conftest import REPO

README = REPO / "controllers" / "python-sdk" / "README.md"


def install_lines() -> str:
    text = README.read_text()
    m = re.search(r"<!-- install:begin -->\n```sh\n(.*?)```\n<!-- install:end -->", text, re.S)
    assert m, "controllers/python-sdk/README.md has no install block"
    return m.group(1)


def read_only_copy(dest: Path) -> list[Path]:
    """What a clone holds of the SDK and the protos (tracked files and new ones git does not
    ignore: never generated stubs), copied and made read-only."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z", "--", "controllers/python-sdk", "proto"],
                            cwd=REPO, capture_output=True, check=True).stdout.decode().split("\0")
    files = [f for f in listed if f and (REPO / f).is_file()]
    for f in files:
        target = dest / f
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((REPO / f).read_bytes())
    for path in [dest, *dest.rglob("*")]:
        path.chmod(stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH | (stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH if path.is_dir() else 0))
    return sorted(dest.rglob("*"))


def writable(dest: Path) -> None:
    for path in [dest, *dest.rglob("*")]:
        path.chmod(stat.S_IRWXU if path.is_dir() else stat.S_IRUSR | stat.S_IWUSR)


def test_the_readme_install_lines_work_from_a_read_only_copy(tmp_path: Path) -> None:
    clone = tmp_path / "ctrlhub"
    before = read_only_copy(clone)
    project = tmp_path / "project"
    project.mkdir()
    venv = str(REPO / ".venv")
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(venv))
    env.update(CTRLHUB=str(clone), PIP_DISABLE_PIP_VERSION_CHECK="1")
    try:
        script = install_lines()
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=project, env=env, capture_output=True,
                              text=True, timeout=900, check=False)
        assert proc.returncode == 0, f"{script}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        check = subprocess.run([str(project / ".venv" / "bin" / "python"), "-c",
                                "import ctrlhub, ctrlhub.v1.controller_pb2 as pb, kubernetes; "
                                "print(ctrlhub.__file__); pb.ControllerMessage(register={'controller_name': 'x'})"],
                               cwd=project, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert check.returncode == 0, check.stderr
        assert check.stdout.startswith(str(project / ".venv")), f"imported from the new virtualenv: {check.stdout}"
        # The check that counts: the mode bits do not stop root, the listing does.
        assert sorted(clone.rglob("*")) == before, "the install wrote nothing into the repository"
    finally:
        writable(clone)


def test_the_front_page_shows_the_same_install_lines() -> None:
    """The repository's README teaches the Python install too: the lines it shows are the ones
    the test above runs, so the two cannot drift."""
    front = (REPO / "README.md").read_text()
    assert f"```sh\n{install_lines()}```" in front, "README.md's Python install block differs from the SDK README's"
