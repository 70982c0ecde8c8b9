"""The Python quick start of docs/sdks.md (the README links to it), extracted verbatim and run
as a process against a real manager and devcluster: it must stamp labelled ConfigMaps, leave
the others alone, and drain and exit 0 on SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, Cluster, Manager, eventually, free_port

STAMP = "example.com/stamped-at"


def quickstart() -> str:
    page = (REPO / "docs" / "sdks.md").read_text()
    m = re.search(r"<!-- python-quickstart:begin -->\n```python\n(.*?)```\n<!-- python-quickstart:end -->", page, re.S)
    assert m, "docs/sdks.md has no python-quickstart block"
    return m.group(1)


def probe(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()
    except OSError as err:
        return 0, str(err)


@pytest.mark.parametrize("logs", ["default", "trace-json"])
def test_quickstart_stamps_labelled_configmaps(devcluster: Cluster, manager: Manager, ns: str, tmp_path: Path, logs: str) -> None:
    """The same round at the default level and with CTRLHUB_LOG=trace in JSON (no log level
    changes behaviour), the second also serving health probes from CTRLHUB_HEALTH_ADDR."""
    code = quickstart()
    assert len(code.splitlines()) <= 35, "the quick start stays about 30 lines"
    script = tmp_path / "stamp.py"
    script.write_text(code)
    env = {**os.environ, "KUBECONFIG": str(devcluster.kubeconfig), "CTRLHUB_ADDR": manager.addr}
    health = f"127.0.0.1:{free_port()}"
    if logs == "trace-json":
        env.update(CTRLHUB_LOG="trace", CTRLHUB_LOG_FORMAT="json", CTRLHUB_HEALTH_ADDR=health)
    log = open(tmp_path / "stamp.log", "w")
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
        if logs == "trace-json":
            assert probe(f"http://{health}/readyz") == (200, "ready\n")
            assert probe(f"http://{health}/healthz") == (200, "ok\n")
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        log.close()
    out = (tmp_path / "stamp.log").read_text()
    assert code == 0, out
    assert f"stamped {ns}/labelled" in out
    if logs == "trace-json":
        lines = [json.loads(line) for line in out.splitlines()]  # every line is one JSON object
        assert any(j["level"] == "TRACE" and j["fields"]["message"].startswith("received reconcile") for j in lines)
        start = next(j for j in lines if j["fields"]["message"].startswith(f"reconcile start key={ns}/labelled"))
        assert start["fields"]["key"] == f"{ns}/labelled" and start["span"]["key"] == f"{ns}/labelled" and start["span"]["request_id"]
        (mine,) = [j for j in lines if j["fields"]["message"] == f"stamped {ns}/labelled"]
        assert mine["target"] == "ctrlhub.stamp" and mine["span"]["request_id"] == start["span"]["request_id"]
