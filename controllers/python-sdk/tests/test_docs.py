"""The documentation says what the code does: the README's lists of handler arguments are the
ones the SDK passes, every environment variable named in the SDK's sources, docs, examples and
manifests exists (the SDK's own, or the manager's flags), the Website's line count is right,
and the deploy example validates and probes what the SDK serves."""

from __future__ import annotations

import inspect
import re
import subprocess
from pathlib import Path

import ctrlhub
import yaml
from conftest import REPO, binary
from ctrlhub._request import EVENT_KWARGS, RECONCILE_KWARGS

SDK = REPO / "controllers" / "python-sdk"
README = (SDK / "README.md").read_text()


def listed(marker: str) -> set[str]:
    m = re.search(f"<!-- {marker}:begin -->\n(.*?)<!-- {marker}:end -->", README, re.S)
    assert m, f"no {marker} list in the README"
    return set(re.findall(r"`(\w+)`", m.group(1)))


def test_the_readme_lists_every_handler_argument() -> None:
    assert listed("reconcile-args") == set(RECONCILE_KWARGS)
    assert listed("event-args") == set(EVENT_KWARGS)
    for fn, names in ((ctrlhub.Operator.reconcile, RECONCILE_KWARGS), (ctrlhub.Operator.on_event, EVENT_KWARGS)):
        doc = inspect.getdoc(fn) or ""
        missing = [n for n in names if f"``{n}``" not in doc]
        assert not missing, f"{fn.__qualname__}'s docstring does not name {missing}"
    keywords = set(ctrlhub.Options.__annotations__)
    assert all(f"`{k}`" in README for k in keywords), "the README names every definition keyword"


def documented_files() -> list[Path]:
    files = [*SDK.joinpath("src", "ctrlhub").glob("*.py"), SDK / "README.md", SDK / "hatch_build.py",
             *SDK.joinpath("examples").rglob("*.py"), *SDK.joinpath("examples").rglob("*.md"),
             *REPO.joinpath("controllers", "python").glob("*.py"), REPO / "controllers" / "python" / "README.md",
             REPO / "tests" / "conformance" / "python_sdk" / "controller.py",
             *REPO.joinpath("deploy", "examples", "python-website").glob("*.yaml")]
    return [f for f in files if f.is_file()]


def test_every_environment_variable_named_exists() -> None:
    sdk_reads = {m for f in SDK.joinpath("src", "ctrlhub").glob("*.py") for m in re.findall(r'"(CTRLHUB_[A-Z_]+)"', f.read_text())}
    sdk_reads |= {f"CTRLHUB_TLS_{v}" for v in ("CA_FILE", "CERT_FILE", "KEY_FILE", "SERVER_NAME")}  # built from a prefix
    assert {"CTRLHUB_ADDR", "CTRLHUB_TOKEN", "CTRLHUB_TOKEN_FILE", "CTRLHUB_REVISION", "CTRLHUB_LOG", "CTRLHUB_LOG_FORMAT",
            "CTRLHUB_HEALTH_ADDR"} <= sdk_reads
    help_text = subprocess.run([str(binary("ctrlhub")), "run", "--help"], capture_output=True, text=True, timeout=60, check=False).stdout
    manager = set(re.findall(r"env: (CTRLHUB_[A-Z_]+)", help_text))
    tests_read = {m for f in REPO.joinpath("controllers", "python", "tests").glob("*.py") for m in re.findall(r'"(CTRLHUB_[A-Z_]+)"', f.read_text())}
    assert "CTRLHUB_WATCH_NAMESPACE" in manager
    for f in documented_files():
        text = f.read_text()
        unknown = {v for v in re.findall(r"\bCTRLHUB_[A-Z0-9_]*[A-Z0-9]\b", text)} - sdk_reads - manager - tests_read
        assert not unknown, f"{f.relative_to(REPO)} names {sorted(unknown)}, which nothing reads"
        stale = re.findall(r"(?<![A-Z_])(?:WATCH_NAMESPACES?|LOG_FORMAT|LOG_LEVEL)\b", text)
        assert not stale, f"{f.relative_to(REPO)} names {stale}: the variables are CTRLHUB_WATCH_NAMESPACE (the manager's), CTRLHUB_LOG, CTRLHUB_LOG_FORMAT"
    for var in sdk_reads:
        assert var in README or (var.startswith("CTRLHUB_TLS_") and "CTRLHUB_TLS_*" in README), f"the README does not document {var}"


def test_the_website_line_count_in_the_readme_is_the_files() -> None:
    lines = (SDK / "examples" / "website" / "website.py").read_text().splitlines()
    assert len(lines) <= 80, "the issue's budget"
    non_blank = [line for line in lines if line.strip()]
    assert f"**{len(lines)} lines**" in README and f"({len(non_blank)} non-blank" in README


def test_the_deploy_example_validates_and_probes_the_health_port() -> None:
    import kubernetes_validate

    folder = REPO / "deploy" / "examples" / "python-website"
    docs = [d for f in sorted(folder.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text()) if d]
    for doc in docs:
        kubernetes_validate.validate(doc, "1.32", strict=True)
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    port = int(env["CTRLHUB_HEALTH_ADDR"].rpartition(":")[2])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"} and ports["health"] == port
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "health"}
    assert env["CTRLHUB_LOG_FORMAT"] == "json" and "POD_NAME" in env
    assert deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] > ctrlhub.Config().shutdown_grace
    rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]]
    granted = {(g, res, v) for r in rules for g in r["apiGroups"] for res in r["resources"] for v in r["verbs"]}
    needed = {("example.ctrlhub.io", "websites", "watch"), ("example.ctrlhub.io", "websites", "patch"),
              ("example.ctrlhub.io", "websites/status", "patch"), ("apps", "deployments", "watch"), ("apps", "deployments", "patch"),
              ("", "services", "watch"), ("", "services", "patch"), ("", "configmaps", "create"), ("", "configmaps", "patch"),
              ("", "events", "create"), ("", "events", "patch")}
    assert needed <= granted, needed - granted
