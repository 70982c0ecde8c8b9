"""Build hook: generate the ctrlhub.v1 stubs from the .proto files with grpcio-tools.

Runs for every wheel build (``pip install ./controllers/python-sdk``). The protos come from
the repository's ``proto/`` directory (two levels up), or from ``proto/`` beside this file when
building from an sdist, which carries a copy. protoc's imports mirror the proto package (``from
ctrlhub.v1 import read_pb2``), so generated code is used exactly as generated.

A wheel's stubs are generated into a temporary directory and added to the wheel from there:
the source tree is only read, so a read-only clone installs. An editable install (``pip
install -e``, a developer's writable tree) generates them into ``src/ctrlhub/v1`` instead
(git-ignored), where the editable package imports them from.
"""

from __future__ import annotations

import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class StubsHook(BuildHookInterface):  # type: ignore[type-arg]
    """Generates ``ctrlhub/v1/*_pb2{,_grpc}.py`` and ``*_pb2.pyi`` before the build."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel":
            return
        root = Path(self.root)
        candidates = [root / "proto", root.parent.parent / "proto"]
        proto_root = next((p for p in candidates if (p / "ctrlhub" / "v1").is_dir()), None)
        if proto_root is None:
            raise RuntimeError(f"ctrlhub-sdk: no proto/ctrlhub/v1 in {' or '.join(map(str, candidates))}")
        if version == "editable":
            self._generate(proto_root, root / "src")
            return
        self._tmp = Path(tempfile.mkdtemp(prefix="ctrlhub-sdk-stubs-"))
        self._generate(proto_root, self._tmp)
        force = build_data.setdefault("force_include", {})
        for path in sorted((self._tmp / "ctrlhub" / "v1").iterdir()):
            force[str(path)] = f"ctrlhub/v1/{path.name}"

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    @staticmethod
    def _generate(proto_root: Path, out: Path) -> None:
        from grpc_tools import protoc

        (out / "ctrlhub" / "v1").mkdir(parents=True, exist_ok=True)
        protos = sorted((proto_root / "ctrlhub" / "v1").glob("*.proto"))
        well_known = Path(str(resources.files("grpc_tools") / "_proto"))
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{well_known}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            f"--pyi_out={out}",
            *(str(p.relative_to(proto_root)) for p in protos),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"ctrlhub-sdk: protoc failed on {proto_root} (diagnostics above)")
