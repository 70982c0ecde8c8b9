//! Built-in kinds are validated as kube-apiserver validates them: wrong JSON types
//! are 400 with the Go decoder's message, unknown fields follow `fieldValidation`, invalid
//! objects are 422 with `field.ErrorList` causes, and watch-list options are checked. Driven
//! through kube-rs (what controllers use) and raw HTTPS (headers and exact bodies).

use ctrlhub_tests::{Cluster, PATIENCE, install_widget_crd, start_cluster, wait_until};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams, ValidationDirective};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

const CM: &str = "/api/v1/namespaces/default/configmaps";

/// The 422 causes of a failed kube-rs call, as (field, reason, message).
fn causes<T: std::fmt::Debug>(result: kube::Result<T>) -> Vec<(String, String, String)> {
    match result {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 422, "expected 422 Invalid, got {status:?}");
            assert_eq!(status.reason, "Invalid", "{status:?}");
            status
                .details
                .map(|d| {
                    d.causes
                        .into_iter()
                        .map(|c| (c.field, c.reason, c.message))
                        .collect()
                })
                .unwrap_or_default()
        }
        other => panic!("expected 422 Invalid, got {other:?}"),
    }
}

/// Creates `obj` of kind `K` through kube-rs and requires a 422 with a cause on `field` of
/// `reason` whose message starts with `message`.
async fn assert_invalid<K>(api: &Api<K>, obj: Value, field: &str, reason: &str, message: &str)
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let typed: K = serde_json::from_value(obj.clone()).expect("typed object");
    let got = causes(api.create(&PostParams::default(), &typed).await);
    assert!(
        got.iter()
            .any(|(f, r, m)| f == field && r == reason && m.starts_with(message)),
        "{obj}: no cause {field} {reason} {message:?} in {got:?}"
    );
}

fn labels_and_selector(kind: &str, api_version: &str, selector: &str, label: &str) -> Value {
    json!({
        "apiVersion": api_version, "kind": kind,
        "metadata": {"name": format!("{}-x", kind.to_lowercase())},
        "spec": {
            "selector": {"matchLabels": {"app": selector}},
            "serviceName": "s",
            "template": {
                "metadata": {"labels": {"app": label}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}
            }
        }
    })
}

#[tokio::test]
async fn workload_selectors_must_match_their_template_labels() {
    let tc = start_cluster().await;
    let msg = "Invalid value: map[string]string{\"app\":\"b\"}: `selector` does not match template `labels`";
    let field = "spec.template.metadata.labels";
    let obj = |kind| labels_and_selector(kind, "apps/v1", "a", "b");
    assert_invalid(
        &tc.api::<Deployment>("default"),
        obj("Deployment"),
        field,
        "FieldValueInvalid",
        msg,
    )
    .await;
    assert_invalid(
        &tc.api::<ReplicaSet>("default"),
        obj("ReplicaSet"),
        field,
        "FieldValueInvalid",
        msg,
    )
    .await;
    assert_invalid(
        &tc.api::<StatefulSet>("default"),
        obj("StatefulSet"),
        field,
        "FieldValueInvalid",
        msg,
    )
    .await;
    assert_invalid(
        &tc.api::<DaemonSet>("default"),
        obj("DaemonSet"),
        field,
        "FieldValueInvalid",
        msg,
    )
    .await;
    let mut job = labels_and_selector("Job", "batch/v1", "a", "b");
    job["spec"]["manualSelector"] = json!(true);
    job["spec"]["template"]["spec"]["restartPolicy"] = json!("Never");
    assert_invalid(
        &tc.api::<Job>("default"),
        job,
        field,
        "FieldValueInvalid",
        msg,
    )
    .await;

    // The same objects with matching labels are accepted, and the Deployment gets the
    // status code and message kube-apiserver answers.
    for kind in ["Deployment", "ReplicaSet", "StatefulSet", "DaemonSet"] {
        let ok = labels_and_selector(kind, "apps/v1", "a", "a");
        let r = tc
            .raw
            .post(
                &format!("/apis/apps/v1/namespaces/default/{}s", kind.to_lowercase()),
                &ok,
            )
            .await;
        assert_eq!(r.status, 201, "{kind}: {}", r.body);
    }
    let bad = labels_and_selector("Deployment", "apps/v1", "a", "b");
    let r = tc
        .raw
        .post("/apis/apps/v1/namespaces/default/deployments", &bad)
        .await;
    assert_eq!(r.status, 422);
    assert_eq!(
        r.body["message"],
        format!("Deployment.apps \"deployment-x\" is invalid: {field}: {msg}")
    );
    assert_eq!(r.body["details"]["kind"], "Deployment");
    assert_eq!(r.body["details"]["group"], "apps");
}

#[tokio::test]
async fn workload_selectors_and_job_templates_are_immutable() {
    let tc = start_cluster().await;
    let deployments = tc.api::<Deployment>("default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"selector": {"matchLabels": {"app": "web"}},
            "template": {"metadata": {"labels": {"app": "web", "v": "1"}},
                "spec": {"containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .expect("deployment");
    deployments
        .create(&PostParams::default(), &d)
        .await
        .expect("create");
    let patch = json!({"spec": {"selector": {"matchLabels": {"v": "1"}}}});
    let got = causes(
        deployments
            .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
            .await,
    );
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, "spec.selector");
    assert!(got[0].2.ends_with(": field is immutable"), "{got:?}");

    let jobs = tc.api::<Job>("default");
    let job: Job = serde_json::from_value(json!({
        "metadata": {"name": "once"},
        "spec": {"template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "c", "image": "busybox"}]}}}
    }))
    .expect("job");
    let created = jobs
        .create(&PostParams::default(), &job)
        .await
        .expect("create job");
    // The server generated the selector on the Job's uid, as kube-apiserver does.
    let uid = created.metadata.uid.clone().expect("uid");
    let selector = created
        .spec
        .as_ref()
        .and_then(|s| s.selector.clone())
        .expect("selector");
    assert_eq!(
        selector
            .match_labels
            .unwrap_or_default()
            .get("batch.kubernetes.io/controller-uid"),
        Some(&uid)
    );
    let patch =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "c", "image": "alpine"}]}}}});
    let got = causes(
        jobs.patch("once", &PatchParams::default(), &Patch::Strategic(&patch))
            .await,
    );
    assert!(
        got.iter()
            .any(|(f, _, m)| f == "spec.template" && m.ends_with("field is immutable")),
        "{got:?}"
    );
}

#[tokio::test]
async fn names_labels_and_annotations_are_validated() {
    let tc = start_cluster().await;
    let cms = tc.api::<ConfigMap>("default");
    let subdomain = "Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain";
    assert_invalid(
        &cms,
        json!({"metadata": {"name": "Bad_Name"}}),
        "metadata.name",
        "FieldValueInvalid",
        subdomain,
    )
    .await;
    // Services are DNS-1035 labels: no leading digit.
    let svc = json!({"metadata": {"name": "1svc"}, "spec": {"ports": [{"port": 80}]}});
    assert_invalid(
        &tc.api::<Service>("default"),
        svc,
        "metadata.name",
        "FieldValueInvalid",
        "Invalid value: \"1svc\": a DNS-1035 label",
    )
    .await;
    let long = "v".repeat(64);
    assert_invalid(
        &cms,
        json!({"metadata": {"name": "l", "labels": {"k": long}}}),
        "metadata.labels",
        "FieldValueInvalid",
        &format!("Invalid value: \"{long}\": must be no more than 63 characters"),
    )
    .await;
    assert_invalid(
        &cms,
        json!({"metadata": {"name": "l", "labels": {"bad key": "v"}}}),
        "metadata.labels",
        "FieldValueInvalid",
        "Invalid value: \"bad key\": name part must consist of alphanumeric characters",
    )
    .await;
    assert_invalid(
        &cms,
        json!({"metadata": {"name": "a", "annotations": {"example.com/": "v"}}}),
        "metadata.annotations",
        "FieldValueInvalid",
        "Invalid value: \"example.com/\": name part must be non-empty",
    )
    .await;
    let big = "x".repeat(256 * 1024);
    assert_invalid(
        &cms,
        json!({"metadata": {"name": "a", "annotations": {"big": big}}}),
        "metadata.annotations",
        "FieldValueTooLong",
        "Too long: must have at most 262144 bytes",
    )
    .await;
    // Just inside every limit is fine.
    let ok: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "fine.name-1",
        "labels": {"example.com/k": "v".repeat(63), "empty": ""},
        "annotations": {"big": "x".repeat(200 * 1024)}}}))
    .expect("cm");
    cms.create(&PostParams::default(), &ok)
        .await
        .expect("valid metadata");
}

#[tokio::test]
async fn pod_containers_and_ports_are_validated() {
    let tc = start_cluster().await;
    let pods = tc.api::<Pod>("default");
    let pod =
        |containers: Value| json!({"metadata": {"name": "p"}, "spec": {"containers": containers}});
    assert_invalid(
        &pods,
        pod(json!([{"name": "a", "image": "i"}, {"name": "a", "image": "i"}])),
        "spec.containers[1].name",
        "FieldValueDuplicate",
        "Duplicate value: \"a\"",
    )
    .await;
    assert_invalid(
        &pods,
        pod(json!([{"name": "a", "image": "i", "ports": [{"containerPort": 70000}]}])),
        "spec.containers[0].ports[0].containerPort",
        "FieldValueInvalid",
        "Invalid value: 70000: must be between 1 and 65535, inclusive",
    )
    .await;
    assert_invalid(
        &pods,
        pod(json!([])),
        "spec.containers",
        "FieldValueRequired",
        "Required value",
    )
    .await;
    assert_invalid(
        &pods,
        pod(json!([{"name": "a"}])),
        "spec.containers[0].image",
        "FieldValueRequired",
        "Required value",
    )
    .await;
    // Init containers share the name space with containers.
    let mut p = pod(json!([{"name": "a", "image": "i"}]));
    p["spec"]["initContainers"] = json!([{"name": "a", "image": "i"}]);
    assert_invalid(
        &pods,
        p,
        "spec.containers[0].name",
        "FieldValueDuplicate",
        "Duplicate value: \"a\"",
    )
    .await;
}

#[tokio::test]
async fn service_ports_are_validated() {
    let tc = start_cluster().await;
    let svcs = tc.api::<Service>("default");
    let svc = |ports: Value| json!({"metadata": {"name": "s"}, "spec": {"ports": ports}});
    assert_invalid(
        &svcs,
        svc(json!([{"port": 0}])),
        "spec.ports[0].port",
        "FieldValueInvalid",
        "Invalid value: 0: must be between 1 and 65535, inclusive",
    )
    .await;
    assert_invalid(
        &svcs,
        svc(json!([{"name": "a", "port": 80}, {"port": 81}])),
        "spec.ports[1].name",
        "FieldValueRequired",
        "Required value",
    )
    .await;
    assert_invalid(
        &svcs,
        svc(json!([{"name": "a", "port": 80}, {"name": "a", "port": 81}])),
        "spec.ports[1].name",
        "FieldValueDuplicate",
        "Duplicate value: \"a\"",
    )
    .await;
    assert_invalid(
        &svcs,
        svc(json!([{"port": 80, "protocol": "HTTP"}])),
        "spec.ports[0].protocol",
        "FieldValueNotSupported",
        "Unsupported value: \"HTTP\"",
    )
    .await;
    assert_invalid(
        &svcs,
        svc(json!([])),
        "spec.ports",
        "FieldValueRequired",
        "Required value",
    )
    .await;
    let headless: Service =
        serde_json::from_value(json!({"metadata": {"name": "h"}, "spec": {"clusterIP": "None"}}))
            .expect("svc");
    svcs.create(&PostParams::default(), &headless)
        .await
        .expect("headless services need no ports");
}

#[tokio::test]
async fn config_map_and_secret_keys_and_sizes_are_validated() {
    let tc = start_cluster().await;
    let cms = tc.api::<ConfigMap>("default");
    assert_invalid(
        &cms,
        json!({"metadata": {"name": "c"}, "data": {"a b": "x"}}),
        "data[a b]",
        "FieldValueInvalid",
        "Invalid value: \"a b\": a valid config key must consist of alphanumeric characters",
    )
    .await;
    assert_invalid(
        &cms,
        json!({"metadata": {"name": "c"}, "data": {"k": "x"}, "binaryData": {"k": "eA=="}}),
        "binaryData[k]",
        "FieldValueInvalid",
        "Invalid value: \"k\": duplicate of key present in data",
    )
    .await;
    assert_invalid(
        &cms,
        json!({"metadata": {"name": "c"}, "data": {"k": "x".repeat(1024 * 1024 + 1)}}),
        "[]",
        "FieldValueTooLong",
        "Too long: must have at most 1048576 bytes",
    )
    .await;
    let secrets = tc.api::<Secret>("default");
    assert_invalid(
        &secrets,
        json!({"metadata": {"name": "t"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "eA=="}}),
        "data[tls.key]",
        "FieldValueRequired",
        "Required value",
    )
    .await;
    // An immutable ConfigMap keeps its data.
    let frozen: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "frozen"}, "immutable": true, "data": {"k": "v"}}),
    )
    .expect("cm");
    cms.create(&PostParams::default(), &frozen)
        .await
        .expect("create");
    let got = causes(
        cms.patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "w"}})),
        )
        .await,
    );
    assert_eq!(got[0].0, "data");
    assert_eq!(got[0].1, "FieldValueForbidden");
}

#[tokio::test]
async fn lease_fields_are_validated() {
    let tc = start_cluster().await;
    let leases = tc.api::<Lease>("default");
    assert_invalid(
        &leases,
        json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 0}}),
        "spec.leaseDurationSeconds",
        "FieldValueInvalid",
        "Invalid value: 0: must be greater than 0",
    )
    .await;
    assert_invalid(
        &leases,
        json!({"metadata": {"name": "l"}, "spec": {"leaseTransitions": -1}}),
        "spec.leaseTransitions",
        "FieldValueInvalid",
        "Invalid value: -1: must be greater than or equal to 0",
    )
    .await;
}

#[tokio::test]
async fn wrong_json_types_are_400_with_the_go_decoder_message() {
    let tc = start_cluster().await;
    let d = json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "three"},
        "spec": {"replicas": "three", "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}}});
    let r = tc
        .raw
        .post("/apis/apps/v1/namespaces/default/deployments", &d)
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.body["reason"], "BadRequest");
    assert_eq!(
        r.body["message"],
        "Deployment in version \"v1\" cannot be handled as a Deployment: json: cannot unmarshal string into Go struct field DeploymentSpec.spec.replicas of type int32"
    );
    // kube-rs sees the same through a dynamic client.
    let gvk = GroupVersionKind::gvk("apps", "v1", "Deployment");
    let api: Api<DynamicObject> =
        Api::namespaced_with(tc.client.clone(), "default", &ApiResource::from_gvk(&gvk));
    let obj: DynamicObject = serde_json::from_value(d).expect("dynamic object");
    match api.create(&PostParams::default(), &obj).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 400),
        other => panic!("expected 400, got {other:?}"),
    }
    // A patch that breaks a type is refused the same way.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}});
    assert_eq!(tc.raw.post(CM, &cm).await.status, 201);
    let r = tc
        .raw
        .patch(
            &format!("{CM}/c"),
            "application/merge-patch+json",
            &json!({"data": {"k": 1}}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(
        r.body["message"].as_str().is_some_and(|m| m.ends_with(
            "json: cannot unmarshal number into Go struct field ConfigMap.data of type string"
        )),
        "{}",
        r.body
    );
}

/// POSTs a ConfigMap with an unknown top-level field under `fieldValidation` (if any) and
/// returns the status, the Warning headers and the body.
async fn post_with_unknown_field(
    tc: &Cluster,
    name: &str,
    validation: Option<&str>,
) -> (u16, Vec<String>, Value) {
    let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"a": "b"}, "bogus": 1});
    let query = validation
        .map(|v| format!("?fieldValidation={v}"))
        .unwrap_or_default();
    let resp = tc
        .raw
        .http()
        .post(tc.raw.url(&format!("{CM}{query}")))
        .json(&body)
        .send()
        .await
        .expect("request");
    let status = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all("warning")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect();
    (status, warnings, resp.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn unknown_fields_follow_field_validation() {
    let tc = start_cluster().await;
    let (status, _, body) = post_with_unknown_field(&tc, "strict", Some("Strict")).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["message"],
        "ConfigMap in version \"v1\" cannot be handled as a ConfigMap: strict decoding error: unknown field \"bogus\""
    );
    // Warn is the default: stored without the field, with one warning per field.
    let (status, warnings, body) = post_with_unknown_field(&tc, "warn", None).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(
        warnings,
        vec!["299 - \"unknown field \\\"bogus\\\"\"".to_string()]
    );
    assert!(body.get("bogus").is_none(), "{body}");
    assert_eq!(body["data"]["a"], "b");
    let (status, warnings, body) = post_with_unknown_field(&tc, "ignore", Some("Ignore")).await;
    assert_eq!(status, 201, "{body}");
    assert!(warnings.is_empty(), "{warnings:?}");
    assert!(body.get("bogus").is_none(), "{body}");

    // Patches and apply go through the same check (kube-rs sets fieldValidation on patches).
    let cms = tc.api::<ConfigMap>("default");
    let strict = PatchParams {
        field_validation: Some(ValidationDirective::Strict),
        ..PatchParams::default()
    };
    let nested = json!({"metadata": {"labelz": {"a": "b"}}});
    match cms.patch("warn", &strict, &Patch::Merge(&nested)).await {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 400);
            assert!(
                s.message
                    .ends_with("strict decoding error: unknown field \"metadata.labelz\""),
                "{}",
                s.message
            );
        }
        other => panic!("expected 400, got {other:?}"),
    }
    let apply = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied"}, "spec": {"x": 1}});
    let strict_apply = PatchParams {
        field_validation: Some(ValidationDirective::Strict),
        ..PatchParams::apply("validation-test")
    };
    match cms
        .patch("applied", &strict_apply, &Patch::Apply(&apply))
        .await
    {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 400, "{s:?}"),
        other => panic!("expected 400, got {other:?}"),
    }
    let ignore_apply = PatchParams {
        field_validation: Some(ValidationDirective::Ignore),
        ..PatchParams::apply("validation-test")
    };
    let applied = cms
        .patch("applied", &ignore_apply, &Patch::Apply(&apply))
        .await
        .expect("Ignore drops the field");
    let mf = serde_json::to_string(&applied.metadata.managed_fields).expect("json");
    assert!(!mf.contains("f:spec"), "nobody owns a dropped field: {mf}");
}

#[tokio::test]
async fn custom_resources_answer_field_validation_the_same_way() {
    let tc = start_cluster().await;
    install_widget_crd(&tc.client).await;
    let path = "/apis/conformance.ctrlhub.dev/v1/namespaces/default/widgets";
    let w = json!({"apiVersion": "conformance.ctrlhub.dev/v1", "kind": "Widget", "metadata": {"name": "w"},
        "spec": {"size": 1, "shape": "round"}});
    let r = tc
        .raw
        .post(&format!("{path}?fieldValidation=Strict"), &w)
        .await;
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(
        r.body["message"],
        "Widget in version \"v1\" cannot be handled as a Widget: strict decoding error: unknown field \"spec.shape\""
    );
    let resp = tc
        .raw
        .http()
        .post(tc.raw.url(path))
        .json(&w)
        .send()
        .await
        .expect("post");
    assert_eq!(resp.status().as_u16(), 201);
    let warning = resp
        .headers()
        .get("warning")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    assert_eq!(
        warning.as_deref(),
        Some("299 - \"unknown field \\\"spec.shape\\\"\"")
    );
}

#[tokio::test]
async fn custom_resource_lists_merge_by_their_list_map_keys_under_apply() {
    let tc = start_cluster().await;
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "routes.lists.ctrlhub.dev"},
        "spec": {"group": "lists.ctrlhub.dev", "scope": "Namespaced",
            "names": {"plural": "routes", "singular": "route", "kind": "Route"},
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object", "properties": {"spec": {"type": "object", "properties": {
                    "rules": {"type": "array", "x-kubernetes-list-type": "map",
                        "x-kubernetes-list-map-keys": ["host", "port"],
                        "items": {"type": "object", "required": ["host", "port"], "properties": {
                            "host": {"type": "string"}, "port": {"type": "integer"},
                            "target": {"type": "string"}}}}}}}}}}]}
    });
    let r = tc
        .raw
        .post(
            "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            &crd,
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let gvk = GroupVersionKind::gvk("lists.ctrlhub.dev", "v1", "Route");
    let api: Api<DynamicObject> =
        Api::namespaced_with(tc.client.clone(), "default", &ApiResource::from_gvk(&gvk));
    wait_until("routes served", PATIENCE, || async {
        api.list(&Default::default())
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    let rule =
        |host: &str, port: i64, target: &str| json!({"host": host, "port": port, "target": target});
    let body = |rules: Value| json!({"apiVersion": "lists.ctrlhub.dev/v1", "kind": "Route", "metadata": {"name": "r"}, "spec": {"rules": rules}});
    api.patch(
        "r",
        &PatchParams::apply("team-a"),
        &Patch::Apply(body(json!([rule("a", 80, "x")]))),
    )
    .await
    .expect("team-a applies its rule");
    // Another manager adds a rule with the same host on another port: a different item.
    let merged = api
        .patch(
            "r",
            &PatchParams::apply("team-b"),
            &Patch::Apply(body(json!([rule("a", 443, "y")]))),
        )
        .await
        .expect("no conflict: a different list item");
    assert_eq!(
        merged.data["spec"]["rules"],
        json!([rule("a", 80, "x"), rule("a", 443, "y")])
    );
    // Changing team-a's item is a conflict on that item's field only.
    match api
        .patch(
            "r",
            &PatchParams::apply("team-b"),
            &Patch::Apply(body(json!([rule("a", 443, "y"), rule("a", 80, "z")]))),
        )
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 409);
            assert!(
                s.message.contains(".spec.rules[host=\"a\",port=80].target"),
                "{}",
                s.message
            );
        }
        other => panic!("expected a conflict, got {other:?}"),
    }
}

#[tokio::test]
async fn watch_lists_need_resource_version_match_not_older_than() {
    let tc = start_cluster().await;
    let r = tc
        .raw
        .get(&format!("{CM}?watch=true&sendInitialEvents=true"))
        .await;
    assert_eq!(r.status, 422, "{}", r.body);
    assert_eq!(
        r.body["message"],
        "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"
    );
    assert_eq!(
        r.body["details"]["causes"][0]["reason"],
        "FieldValueForbidden"
    );
    assert_eq!(
        r.body["details"]["causes"][0]["field"],
        "resourceVersionMatch"
    );
    let r = tc.raw.get(&format!("{CM}?sendInitialEvents=true")).await;
    assert_eq!(
        r.status, 422,
        "sendInitialEvents is forbidden for list: {}",
        r.body
    );

    // kube-rs's streaming list sends the valid form and gets the initial events.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "seen"}});
    assert_eq!(tc.raw.post(CM, &cm).await.status, 201);
    let api = tc.api::<ConfigMap>("default");
    let cfg = watcher::Config::default().streaming_lists();
    let mut stream = watcher(api, cfg).boxed();
    let first = ctrlhub_tests::within("streaming list", PATIENCE, async {
        loop {
            match stream.try_next().await.expect("watch").expect("open") {
                watcher::Event::InitApply(cm) => break cm,
                _ => continue,
            }
        }
    })
    .await;
    assert_eq!(first.metadata.name.as_deref(), Some("seen"));
}
