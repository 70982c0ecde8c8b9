"""Build hook: generate the ctrlhub.v1 stubs from the .proto files with grpcio-tools.

Runs for every wheel and editable build (``pip install ./controllers/python-sdk``). The
protos come from the repository's ``proto/`` directory (two levels up), or from ``proto/``
beside this file when building from an sdist, which carries a copy. protoc's imports mirror
the proto package (``from ctrlhub.v1 import read_pb2``), and the output lands in the real
``ctrlhub.v1`` package of this distribution, so generated code is used exactly as generated.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface


class StubsHook(BuildHookInterface):  # type: ignore[type-arg]
    """Generates ``src/ctrlhub/v1/*_pb2{,_grpc}.py`` and ``*_pb2.pyi`` before the build."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name not in ("wheel", "editable"):
            return
        root = Path(self.root)
        candidates = [root / "proto", root.parent.parent / "proto"]
        proto_root = next((p for p in candidates if (p / "ctrlhub" / "v1").is_dir()), None)
        if proto_root is None:
            raise RuntimeError(f"ctrlhub-sdk: no proto/ctrlhub/v1 in {' or '.join(map(str, candidates))}")
        protos = sorted((proto_root / "ctrlhub" / "v1").glob("*.proto"))
        out = root / "src"
        from grpc_tools import protoc

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
