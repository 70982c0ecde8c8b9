"""The README's Python quick start, extracted verbatim and run as a process against a real
manager and devcluster: it must stamp labelled ConfigMaps, leave the others alone, and drain
and exit 0 on SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from conftest import REPO, Cluster, Manager, eventually

STAMP = "example.com/stamped-at"


def quickstart() -> str:
    readme = (REPO / "README.md").read_text()
    m = re.search(r"<!-- python-quickstart:begin -->\n```python\n(.*?)```\n<!-- python-quickstart:end -->", readme, re.S)
    assert m, "README.md has no python-quickstart block"
    return m.group(1)


def test_quickstart_stamps_labelled_configmaps(devcluster: Cluster, manager: Manager, ns: str, tmp_path: Path) -> None:
    code = quickstart()
    assert len(code.splitlines()) <= 35, "the quick start stays about 30 lines"
    script = tmp_path / "stamp.py"
    script.write_text(code)
    env = {**os.environ, "KUBECONFIG": str(devcluster.kubeconfig), "CTRLHUB_ADDR": manager.addr}
    log = open(tmp_path / "stamp.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        devcluster.configmap(ns, "labelled", {"a": "b"}, labels={"example.com/stamp": "yes"})
        devcluster.configmap(ns, "plain", {"a": "b"})

        def stamped() -> str | None:
            assert proc.poll() is None, (tmp_path / "stamp.log").read_text()
            return (devcluster.read(ns, "labelled")["metadata"].get("annotations") or {}).get(STAMP)

        import asyncio

        asyncio.run(eventually("the stamp", stamped))
        assert STAMP not in (devcluster.read(ns, "plain")["metadata"].get("annotations") or {})
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        log.close()
    out = (tmp_path / "stamp.log").read_text()
    assert code == 0, out
    assert f"stamped {ns}/labelled" in out
