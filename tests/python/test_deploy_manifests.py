"""The deploy/ manifests: every overlay, the opt-in monitoring kustomization and the examples
render with kubectl's kustomize and every object passes strict schema validation for Kubernetes
1.32 (kubernetes-validate ships the OpenAPI schemas); the Prometheus scrape configs for clusters
without the Operator pass `promtool check config`."""

import os
import pathlib
import subprocess

import kubernetes_validate
import pytest
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
OVERLAYS = sorted(p.name for p in (REPO / "deploy" / "overlays").iterdir() if p.is_dir())


def kustomize(path: pathlib.Path) -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(path)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def render(overlay: str) -> list[dict]:
    return kustomize(REPO / "deploy" / "overlays" / overlay)


def test_there_are_overlays():
    assert {"cluster-wide", "cluster-wide-no-secrets", "namespaced"} <= set(OVERLAYS)


# Kinds of the Prometheus Operator and cert-manager: not in the Kubernetes schemas.
OPERATOR_GROUPS = ("monitoring.coreos.com/", "cert-manager.io/")


def validate_all(docs: list[dict]) -> None:
    for doc in docs:
        if doc["apiVersion"].startswith(OPERATOR_GROUPS):
            continue
        # Raises ValidationError naming the field on any unknown or mistyped field.
        kubernetes_validate.validate(doc, "1.32", strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_objects_pass_strict_schema_validation(overlay: str):
    docs = render(overlay)
    kinds = {d["kind"] for d in docs}
    assert {"StatefulSet", "Service", "ServiceAccount", "PodDisruptionBudget", "NetworkPolicy"} <= kinds
    # Monitoring is opt-in (deploy/monitoring): a plain cluster has no Operator CRDs.
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    validate_all(docs)


def test_examples_and_components_pass_strict_schema_validation(tmp_path):
    tenant = REPO / "deploy" / "examples" / "memcached-tenant"
    for name in ("namespace.yaml", "rbac.yaml", "controller.yaml"):
        validate_all([d for d in yaml.safe_load_all((tenant / name).read_text()) if d])
    validate_all(kustomize(REPO / "deploy" / "monitoring"))
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    # kustomize takes relative paths only.
    base = os.path.relpath(REPO / "deploy/overlays/cluster-wide", overlay)
    component = os.path.relpath(REPO / "deploy/components/cert-manager", overlay)
    (overlay / "kustomization.yaml").write_text(f"resources: [{base}]\ncomponents: [{component}]\n")
    docs = kustomize(overlay)
    assert {"Certificate", "Issuer"} <= {d["kind"] for d in docs}
    validate_all(docs)
    validate_all(leader_mode(tmp_path))


def leader_mode(tmp_path: pathlib.Path) -> list[dict]:
    """cluster-wide with deploy/components/leader-mode, as docs/operating.md adds it."""
    overlay = tmp_path / "leader-mode"
    overlay.mkdir(exist_ok=True)
    base = os.path.relpath(REPO / "deploy/overlays/cluster-wide", overlay)
    component = os.path.relpath(REPO / "deploy/components/leader-mode", overlay)
    (overlay / "kustomization.yaml").write_text(f"resources: [{base}]\ncomponents: [{component}]\n")
    return kustomize(overlay)


def test_static_scrape_config_passes_promtool_as_shipped():
    path = REPO / "deploy" / "monitoring" / "prometheus-scrape-static.yml"
    out = subprocess.run(["promtool", "check", "config", "--syntax-only", str(path)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    [job] = yaml.safe_load(path.read_text())["scrape_configs"]
    # Static targets carry no Kubernetes metadata: the labels the dashboards filter on are set.
    assert job["job_name"] == "ctrlhub-metrics"
    for group in job["static_configs"]:
        assert group["labels"]["namespace"] == "ctrlhub-system" and group["labels"]["pod"]


def test_scrape_config_without_the_operator_passes_promtool(tmp_path):
    scrape = (REPO / "deploy" / "monitoring" / "prometheus-scrape.yml").read_text()
    [job] = yaml.safe_load(scrape)["scrape_configs"]
    # Debian's prometheus is built without Kubernetes service discovery, so promtool checks the
    # job with the discovery swapped for a static target; everything else is checked as shipped.
    sd = job.pop("kubernetes_sd_configs")
    assert sd == [{"role": "endpoints", "namespaces": {"names": ["ctrlhub-system"]}}]
    checked = dict(job, static_configs=[{"targets": ["127.0.0.1:8080"]}])
    config = tmp_path / "prometheus.yml"
    config.write_text(yaml.safe_dump({"scrape_configs": [checked]}))
    out = subprocess.run(["promtool", "check", "config", "--syntax-only", str(config)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    keep = job["relabel_configs"][0]
    assert keep["action"] == "keep" and keep["regex"] == "ctrlhub-metrics;http"
    # The same job and namespace labels as the ServiceMonitor, so dashboards and alerts work.
    assert job["job_name"] == "ctrlhub-metrics"
    assert job["scheme"] == "https" and "credentials_file" in job["authorization"]


def test_servicemonitor_selects_the_metrics_service():
    docs = kustomize(REPO / "deploy" / "monitoring") + render("cluster-wide")
    monitor = next(d for d in docs if d["kind"] == "ServiceMonitor")
    metrics = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "ctrlhub-metrics")
    assert monitor["metadata"]["namespace"] == metrics["metadata"]["namespace"]
    wanted = monitor["spec"]["selector"]["matchLabels"]
    assert wanted.items() <= metrics["metadata"]["labels"].items()
    ports = {p["name"] for p in metrics["spec"]["ports"]}
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= ports


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rbac_grants_only_what_ctrlhub_needs(overlay: str):
    """Reads for the caches, Leases, TokenReview and SubjectAccessReview, its own TenantPolicy
    objects' status: nothing that writes a tenant's objects, and in ring mode no pod patch."""
    for doc in render(overlay):
        if doc["kind"] not in ("Role", "ClusterRole"):
            continue
        for rule in doc["rules"]:
            verbs = set(rule["verbs"])
            writes = verbs - {"get", "list", "watch"}
            if not writes:
                continue
            resources = set(rule["resources"])
            if writes == {"create"}:
                assert resources <= {"tokenreviews", "subjectaccessreviews"}, rule
            elif resources == {"leases"}:
                # Each member's own Lease, and member Leases removed when members leave.
                assert writes <= {"create", "update", "delete"}, rule
            elif rule["apiGroups"] == ["ctrlhub.io"]:
                # The manager reports on its own TenantPolicy objects (their Accepted condition).
                assert resources == {"tenantpolicies/status"} and writes <= {"update", "patch"}, rule
            else:
                raise AssertionError(f"unexpected write grant: {rule}")


def test_leader_mode_component_adds_only_the_pod_label_grant(tmp_path):
    roles = [d for d in leader_mode(tmp_path) if d["kind"] == "Role" and d["metadata"]["name"] == "ctrlhub-leader-election"]
    [role] = roles
    pods = [r for r in role["rules"] if r["resources"] == ["pods"]]
    assert pods == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]}]


def env_of(statefulset: dict) -> dict:
    return {e["name"]: e for e in statefulset["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_controllers_service_selects_every_member(overlay: str):
    docs = render(overlay)
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    statefulset = next(d for d in docs if d["kind"] == "StatefulSet")
    labels = statefulset["spec"]["template"]["metadata"]["labels"]
    assert "ctrlhub.io/leader" not in services["ctrlhub"]["spec"]["selector"]
    assert services["ctrlhub"]["spec"]["selector"].items() <= labels.items()
    headless = services[statefulset["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    env = env_of(statefulset)
    assert env["CTRLHUB_MODE"]["value"] == "ring"
    assert "CTRLHUB_LEADER_POD_LABEL" not in env


def test_leader_mode_component_selects_only_the_leader(tmp_path):
    docs = leader_mode(tmp_path)
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    assert services["ctrlhub"]["spec"]["selector"].get("ctrlhub.io/leader") == "true"
    statefulset = next(d for d in docs if d["kind"] == "StatefulSet")
    env = env_of(statefulset)
    assert env["CTRLHUB_MODE"]["value"] == "leader"
    assert env["CTRLHUB_LEADER_POD_LABEL"]["value"] == "ctrlhub.io/leader"


def test_namespaced_overlay_sets_the_ceiling():
    deployment = next(d for d in render("namespaced") if d["kind"] == "StatefulSet")
    namespaces = yaml.safe_load_all((REPO / "deploy/overlays/namespaced/namespaces.yaml").read_text())
    assert {n["metadata"]["name"] for n in namespaces} == {"team-a", "team-b"}
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["CTRLHUB_WATCH_NAMESPACE"] == "team-a,team-b"
    docs = render("namespaced")
    bound = {d["metadata"]["namespace"] for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["name"] == "ctrlhub-cache-reader"}
    assert bound == {"team-a", "team-b"}
    # Role instead of ClusterRole: the only cluster-wide grants are the tenancy reviews and the
    # manager's own configuration (TenantPolicy, cluster-scoped, no tenant data).
    cluster_reads = [
        r
        for d in docs
        if d["kind"] == "ClusterRole"
        for r in d["rules"]
        if {"list", "watch"} & set(r["verbs"]) and r["apiGroups"] != ["ctrlhub.io"]
    ]
    assert cluster_reads == []


def test_dashboards_ship_as_configmaps_for_the_grafana_sidecar():
    docs = kustomize(REPO / "deploy" / "monitoring")
    dashboards = {
        d["metadata"]["name"]: d
        for d in docs
        if d["kind"] == "ConfigMap" and d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    }
    shipped = sorted(p.name for p in (REPO / "dashboards" / "grafana").glob("*.json"))
    assert len(dashboards) == len(shipped) >= 3
    for cm in dashboards.values():
        assert cm["metadata"]["namespace"] == "ctrlhub-system"
        assert set(cm["data"]) <= set(shipped)
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r}
    assert {"CtrlhubNoLeader", "CtrlhubManagerDown"} <= alerts
