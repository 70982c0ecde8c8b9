"""The official Python ``kubernetes`` client against devcluster: built-in validation (issue 18).

Invalid objects must fail here as they fail on a real cluster, with the same status code and
``metav1.Status`` causes, and ``fieldValidation`` must behave as kube-apiserver's does.
"""

import json

import pytest
from kubernetes import client, dynamic
from kubernetes.client.rest import ApiException
from kubernetes.dynamic.exceptions import ApiException as DynamicApiException

NS = "default"


def status_of(exc):
    """The metav1.Status a failed call carried."""
    return json.loads(exc.body)


def deployment(name, selector, labels):
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            selector=client.V1LabelSelector(match_labels=selector),
            template=client.V1PodTemplateSpec(
                metadata=client.V1ObjectMeta(labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="nginx")]),
            ),
        ),
    )


def test_deployment_selector_must_match_template_labels(devcluster):
    apps = client.AppsV1Api(devcluster.api_client)
    with pytest.raises(ApiException) as err:
        apps.create_namespaced_deployment(NS, deployment("web", {"app": "web"}, {"app": "api"}))
    assert err.value.status == 422
    status = status_of(err.value)
    assert status["reason"] == "Invalid"
    assert status["details"]["causes"] == [
        {
            "reason": "FieldValueInvalid",
            "message": 'Invalid value: map[string]string{"app":"api"}: `selector` does not match template `labels`',
            "field": "spec.template.metadata.labels",
        }
    ]
    created = apps.create_namespaced_deployment(NS, deployment("web", {"app": "web"}, {"app": "web"}))
    assert created.spec.replicas == 1


def test_label_values_longer_than_63_characters_are_refused(devcluster):
    long_value = "v" * 64
    body = client.V1ConfigMap(metadata=client.V1ObjectMeta(name="labelled", labels={"k": long_value}))
    with pytest.raises(ApiException) as err:
        devcluster.core.create_namespaced_config_map(NS, body)
    assert err.value.status == 422
    cause = status_of(err.value)["details"]["causes"][0]
    assert cause["field"] == "metadata.labels"
    assert cause["message"] == f'Invalid value: "{long_value}": must be no more than 63 characters'


def test_unknown_fields_follow_field_validation(devcluster):
    # The typed client refuses unknown fields itself; the dynamic client sends them.
    configmaps = dynamic.DynamicClient(devcluster.api_client).resources.get(api_version="v1", kind="ConfigMap")
    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "strict"}, "bogus": True}
    with pytest.raises(DynamicApiException) as err:
        configmaps.create(body=body, namespace=NS, query_params=[("fieldValidation", "Strict")])
    assert err.value.status == 400
    assert status_of(err.value)["message"].endswith('strict decoding error: unknown field "bogus"')
    # Ignore drops the field silently and stores the object.
    stored = configmaps.create(body=body, namespace=NS, query_params=[("fieldValidation", "Ignore")])
    assert stored.metadata.name == "strict"
    assert "bogus" not in stored.to_dict()


def test_a_string_replica_count_is_a_bad_request(devcluster):
    deployments = dynamic.DynamicClient(devcluster.api_client).resources.get(api_version="apps/v1", kind="Deployment")
    body = client.ApiClient().sanitize_for_serialization(deployment("three", {"a": "b"}, {"a": "b"}))
    body["spec"]["replicas"] = "three"
    with pytest.raises(DynamicApiException) as err:
        deployments.create(body=body, namespace=NS)
    assert err.value.status == 400
    assert status_of(err.value)["message"] == (
        'Deployment in version "v1" cannot be handled as a Deployment: json: cannot unmarshal '
        "string into Go struct field DeploymentSpec.spec.replicas of type int32"
    )


def test_lease_duration_must_be_positive(devcluster):
    coordination = client.CoordinationV1Api(devcluster.api_client)
    lease = client.V1Lease(
        metadata=client.V1ObjectMeta(name="leader"),
        spec=client.V1LeaseSpec(holder_identity="a", lease_duration_seconds=0),
    )
    with pytest.raises(ApiException) as err:
        coordination.create_namespaced_lease(NS, lease)
    assert err.value.status == 422
    cause = status_of(err.value)["details"]["causes"][0]
    assert cause == {
        "reason": "FieldValueInvalid",
        "message": "Invalid value: 0: must be greater than 0",
        "field": "spec.leaseDurationSeconds",
    }
