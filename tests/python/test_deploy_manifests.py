"""The deploy/ manifests: every overlay renders with kubectl's kustomize and every object passes
strict schema validation for Kubernetes 1.32 (kubernetes-validate ships the OpenAPI schemas)."""

import pathlib
import subprocess

import kubernetes_validate
import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.name for p in (REPO / "deploy" / "overlays").iterdir() if p.is_dir())


def render(overlay: str) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(REPO / "deploy" / "overlays" / overlay)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def test_there_are_overlays():
    assert {"cluster-wide", "namespaced"} <= set(OVERLAYS)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_objects_pass_strict_schema_validation(overlay: str):
    docs = render(overlay)
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ServiceAccount"} <= kinds
    for doc in docs:
        # Raises ValidationError naming the field on any unknown or mistyped field.
        kubernetes_validate.validate(doc, "1.32", strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_controllers_service_selects_only_the_leader(overlay: str):
    services = {d["metadata"]["name"]: d for d in render(overlay) if d["kind"] == "Service"}
    assert services["ctrlhub"]["spec"]["selector"].get("ctrlhub.io/leader") == "true"
    deployment = next(d for d in render(overlay) if d["kind"] == "Deployment")
    env = {e["name"]: e for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CTRLHUB_LEADER_POD_LABEL"]["value"] == "ctrlhub.io/leader"


def test_namespaced_overlay_sets_the_ceiling():
    deployment = next(d for d in render("namespaced") if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["WATCH_NAMESPACE"] == "team-a,team-b"
    bound = {d["metadata"]["namespace"] for d in render("namespaced") if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "ctrlhub-reader"}
    assert bound == {"team-a", "team-b"}
