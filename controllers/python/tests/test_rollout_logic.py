"""Unit tests of config-rollout's pure logic: no network, no processes."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import rollout_controller as rc


def deployment(pod_spec: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    template: dict[str, Any] = {"metadata": {"labels": {"app": "web"}}, "spec": pod_spec}
    if annotations is not None:
        template["metadata"]["annotations"] = annotations
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}, "spec": {"template": template}}


def cm(name: str, data: dict[str, str] | None = None, binary: dict[str, str] | None = None,
       **meta: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, **meta}}
    if data is not None:
        obj["data"] = data
    if binary is not None:
        obj["binaryData"] = binary
    return obj


# ---- mounted ConfigMap discovery ---------------------------------------------------


def test_discovers_every_way_a_pod_template_uses_a_configmap() -> None:
    dep = deployment({
        "volumes": [
            {"name": "a", "configMap": {"name": "vol-cm"}},
            {"name": "s", "secret": {"secretName": "not-a-configmap"}},
            {"name": "p", "projected": {"sources": [{"configMap": {"name": "projected-cm"}},
                                                    {"secret": {"name": "nope"}}]}},
        ],
        "initContainers": [{"name": "init", "envFrom": [{"configMapRef": {"name": "init-cm"}}]}],
        "containers": [
            {
                "name": "web",
                "envFrom": [{"configMapRef": {"name": "envfrom-cm"}}, {"secretRef": {"name": "nope"}}],
                "env": [
                    {"name": "PLAIN", "value": "x"},
                    {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "keyref-cm", "key": "k"}}},
                    {"name": "S", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k"}}},
                ],
            },
            {"name": "sidecar", "env": [{"name": "K2", "valueFrom": {"configMapKeyRef": {"name": "vol-cm"}}}]},
        ],
    })
    assert rc.mounted_configmaps(dep) == ["envfrom-cm", "init-cm", "keyref-cm", "projected-cm", "vol-cm"]


def test_discovery_is_sorted_and_deduplicated() -> None:
    dep = deployment({
        "volumes": [{"name": "b", "configMap": {"name": "b"}}, {"name": "a", "configMap": {"name": "a"}}],
        "containers": [{"name": "c", "envFrom": [{"configMapRef": {"name": "b"}}]}],
    })
    assert rc.mounted_configmaps(dep) == ["a", "b"]


def test_discovery_tolerates_missing_and_malformed_fields() -> None:
    assert rc.mounted_configmaps({}) == []
    assert rc.mounted_configmaps({"spec": None}) == []
    assert rc.mounted_configmaps(deployment({})) == []
    assert rc.mounted_configmaps(deployment({"containers": None, "volumes": "junk"})) == []
    dep = deployment({
        "volumes": [None, {"name": "x", "configMap": {}}, {"name": "y", "configMap": {"name": ""}}],
        "containers": [{"name": "c", "env": [{"name": "E", "valueFrom": None}], "envFrom": [{}]}],
    })
    assert rc.mounted_configmaps(dep) == []


# ---- hash stability and change detection ---------------------------------------------


def test_hash_is_stable_across_order_and_irrelevant_metadata() -> None:
    a1 = cm("a", {"x": "1", "y": "2"}, resourceVersion="10", labels={"ctrlhub.io/rollout": "web"})
    b1 = cm("b", {"k": "v"}, binary={"bin": "AAEC"})
    a2 = cm("a", {"y": "2", "x": "1"}, resourceVersion="11", uid="other")  # same content, other metadata
    h = rc.config_hash([a1, b1])
    assert h == rc.config_hash([b1, a1])
    assert h == rc.config_hash([a2, copy.deepcopy(b1)])
    assert len(h) == 64 and all(c in "0123456789abcdef" for c in h)


def test_hash_is_a_pinned_value() -> None:
    # Pinned so that a change to the canonical form (which would roll every Deployment
    # managed by this controller on upgrade) is a deliberate, visible decision.
    assert rc.config_hash([cm("a", {"k": "v"})]) == "a1b6b73732525eed46a300dda2dca48728cc7aa5630ca7ad0d46f3222d7ad250"
    assert rc.config_hash([]) == "4f53cda18c2baa0c0354bb5f9a3ecbe5ed12ab4d8e11ba873c2f11161202b945"


def test_hash_changes_with_content() -> None:
    base = rc.config_hash([cm("a", {"k": "v"})])
    assert rc.config_hash([cm("a", {"k": "w"})]) != base  # value changed
    assert rc.config_hash([cm("a", {"k2": "v"})]) != base  # key renamed
    assert rc.config_hash([cm("a", {"k": "v"}, binary={"b": "AA=="})]) != base  # binaryData added
    assert rc.config_hash([cm("b", {"k": "v"})]) != base  # a different ConfigMap
    assert rc.config_hash([cm("a", {"k": "v"}), cm("b", {})]) != base  # one more ConfigMap
    assert rc.config_hash([]) != base  # the ConfigMap disappeared


def test_data_and_binary_data_are_not_confused() -> None:
    assert rc.config_hash([cm("a", {"k": "AA=="})]) != rc.config_hash([cm("a", binary={"k": "AA=="})])


def test_empty_and_absent_data_hash_alike() -> None:
    # The API server drops empty maps, so {} and absent must not differ.
    assert rc.config_hash([cm("a")]) == rc.config_hash([cm("a", {}, binary={})])


def test_current_hash_and_patch() -> None:
    assert rc.current_hash(deployment({})) is None
    assert rc.current_hash(deployment({}, {"other": "x"})) is None
    dep = deployment({}, {rc.HASH_ANNOTATION: "abc"})
    assert rc.current_hash(dep) == "abc"
    assert rc.hash_patch("def") == {
        "spec": {"template": {"metadata": {"annotations": {"ctrlhub.io/config-hash": "def"}}}}
    }


def test_registration_matches_the_brief() -> None:
    reg = rc.operator.controllers[0].to_register()
    assert reg.controller_name == "config-rollout"
    assert reg.mode == reg.MODE_RECONCILE
    assert (reg.primary.group, reg.primary.version, reg.primary.kind, reg.primary.plural) == (
        "apps", "v1", "Deployment", "deployments")
    assert len(reg.watches) == 1
    w = reg.watches[0]
    assert (w.resource.group, w.resource.version, w.resource.kind, w.resource.plural) == (
        "", "v1", "ConfigMap", "configmaps")
    assert w.WhichOneof("mapping") == "label_key" and w.label_key == "ctrlhub.io/rollout"
    assert reg.include_object is True
    assert reg.max_in_flight == 2


def test_json_log_lines_have_the_managers_shape() -> None:
    import json
    import logging

    import ctrlhub

    record = logging.LogRecord("ctrlhub.config-rollout", logging.INFO, __file__, 1, "rolled %s", ("ns/web",), None)
    line = json.loads(ctrlhub.JsonFormatter().format(record))
    assert line["level"] == "INFO" and line["target"] == "ctrlhub.config-rollout"
    assert line["fields"] == {"message": "rolled ns/web"} and line["timestamp"][:2] == "20"


def test_an_unknown_log_format_is_refused() -> None:
    with pytest.raises(SystemExit):
        rc.main(["--log-format", "xml"])


def test_a_kubeconfig_it_cannot_read_is_a_one_line_error(tmp_path) -> None:
    with pytest.raises(SystemExit) as exit_:
        rc.main(["--kubeconfig", str(tmp_path / "missing")])
    assert "cannot load Kubernetes configuration" in str(exit_.value.code)
