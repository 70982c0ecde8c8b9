//! Authentication and authorization against devcluster, through real clients: kube-rs, the
//! `kubectl` binary, and raw HTTPS.
//!
//! The manager will authenticate controllers' ServiceAccount tokens with TokenReview (checking
//! audiences) and authorize registrations with SubjectAccessReview, so these suites pin the
//! behaviour both rely on: who a token says you are, when it stops working, and that the
//! review answers match what the server actually enforces.

use std::path::PathBuf;
use std::process::{Output, Stdio};
use std::time::Duration;

use ctrlhub_tests::{Cluster, PATIENCE, RawApi, start_cluster, within};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenReview};
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::process::Command;

const HOUR: Duration = Duration::from_secs(3600);
const API_AUDIENCE: &str = "https://kubernetes.default.svc";

fn from_json<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).expect("test object deserializes")
}

/// Creates `obj` through the admin client.
async fn create<K>(api: &Api<K>, obj: Value) -> K
where
    K: Resource + Clone + std::fmt::Debug + serde::Serialize + DeserializeOwned,
{
    api.create(&PostParams::default(), &from_json(obj))
        .await
        .expect("admin create")
}

/// Namespaces `namespaces` and a ServiceAccount `name` in the first one.
async fn service_account(tc: &Cluster, namespaces: &[&str], name: &str) -> ServiceAccount {
    let ns_api: Api<Namespace> = Api::all(tc.client.clone());
    for ns in namespaces {
        create(&ns_api, json!({"metadata": {"name": ns}})).await;
    }
    create(
        &tc.api::<ServiceAccount>(namespaces[0]),
        json!({"metadata": {"name": name}}),
    )
    .await
}

fn uid_of<K: Resource>(obj: &K) -> String {
    obj.meta().uid.clone().expect("stored objects have a uid")
}

/// A ClusterRole (or Role in `ns`) named `name` granting `verbs` on core `resources`.
async fn role(tc: &Cluster, ns: Option<&str>, name: &str, resources: &[&str], verbs: &[&str]) {
    let body = json!({
        "metadata": {"name": name},
        "rules": [{"apiGroups": [""], "resources": resources, "verbs": verbs}],
    });
    match ns {
        Some(ns) => {
            create(&tc.api::<Role>(ns), body).await;
        }
        None => {
            create(&Api::<ClusterRole>::all(tc.client.clone()), body).await;
        }
    }
}

/// Binds `role_kind`/`role` to ServiceAccount `sa_ns/sa` with a RoleBinding in `ns`, or a
/// ClusterRoleBinding when `ns` is None.
async fn bind(
    tc: &Cluster,
    ns: Option<&str>,
    name: &str,
    role_kind: &str,
    role: &str,
    sa: (&str, &str),
) {
    let body = json!({
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa.1, "namespace": sa.0}],
    });
    match ns {
        Some(ns) => {
            create(&tc.api::<RoleBinding>(ns), body).await;
        }
        None => {
            create(&Api::<ClusterRoleBinding>::all(tc.client.clone()), body).await;
        }
    }
}

async fn client_as(tc: &Cluster, token: &str) -> Client {
    tc.dc
        .client_for_token(token)
        .await
        .expect("kube client for a token")
}

/// The HTTP status of a kube-rs result (200 for success).
fn code<T>(r: &Result<T, kube::Error>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(e) => panic!("expected an API answer, got {e}"),
    }
}

fn api_error<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> Box<kube::core::Status> {
    match r {
        Err(kube::Error::Api(s)) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn token_review(tc: &Cluster, token: &str, audiences: &[&str]) -> Value {
    let api: Api<TokenReview> = Api::all(tc.client.clone());
    let review = create_review(
        &api,
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
               "spec": {"token": token, "audiences": audiences}}),
    )
    .await;
    serde_json::to_value(review.status).expect("status serializes")
}

async fn create_review<K>(api: &Api<K>, obj: Value) -> K
where
    K: Resource + Clone + std::fmt::Debug + serde::Serialize + DeserializeOwned,
{
    api.create(&PostParams::default(), &from_json(obj))
        .await
        .expect("review create")
}

/// The decoded payload of a JWT (base64url, unpadded), without verifying it.
fn jwt_payload(token: &str) -> Value {
    let payload = token.split('.').nth(1).expect("JWT has three parts");
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in payload.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' => 62,
            b'_' => 63,
            _ => panic!("not base64url: {c}"),
        };
        bits = (bits << 6) | u32::from(v);
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    serde_json::from_slice(&out).expect("JWT payload is JSON")
}

// --- kubectl -------------------------------------------------------------------------------

fn write_kubeconfig(tc: &Cluster, name: &str, yaml: &str) -> PathBuf {
    let path = tc.dir.path().join(name);
    std::fs::write(&path, yaml).expect("write kubeconfig");
    path
}

async fn kubectl_with(tc: &Cluster, kubeconfig: &PathBuf, args: &[&str]) -> Output {
    let mut cmd = Command::new("kubectl");
    cmd.arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--cache-dir")
        .arg(tc.dir.path().join("kube-cache"))
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    within(
        &format!("kubectl {}", args.join(" ")),
        PATIENCE,
        cmd.output(),
    )
    .await
    .expect("kubectl must be installed and runnable")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

// --- tests ---------------------------------------------------------------------------------

#[tokio::test]
async fn kubectl_create_token_issues_a_token_that_authenticates() {
    let tc = start_cluster().await;
    let sa = service_account(&tc, &["team-a"], "ctl").await;
    let out = kubectl_with(
        &tc,
        &tc.kubeconfig,
        &[
            "create",
            "token",
            "ctl",
            "-n",
            "team-a",
            "--audience",
            "ctrlhub",
            "--duration",
            "15m",
        ],
    )
    .await;
    assert!(
        out.status.success(),
        "kubectl create token: {}",
        text(&out.stderr)
    );
    let token = text(&out.stdout);

    // The JWT carries kube-apiserver's claims.
    let claims = jwt_payload(&token);
    assert_eq!(claims["sub"], "system:serviceaccount:team-a:ctl");
    assert_eq!(claims["aud"], json!(["ctrlhub"]));
    assert_eq!(claims["iss"], API_AUDIENCE);
    let exp = claims["exp"].as_i64().expect("exp");
    let iat = claims["iat"].as_i64().expect("iat");
    assert_eq!(exp - iat, 900, "15m duration: {claims}");
    assert_eq!(claims["nbf"], claims["iat"]);
    assert_eq!(claims["kubernetes.io"]["namespace"], "team-a");
    assert_eq!(claims["kubernetes.io"]["serviceaccount"]["name"], "ctl");
    assert_eq!(
        claims["kubernetes.io"]["serviceaccount"]["uid"],
        uid_of(&sa)
    );

    // TokenReview for its audience authenticates it as the ServiceAccount.
    let status = token_review(&tc, &token, &["ctrlhub"]).await;
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(
        status["user"]["username"],
        "system:serviceaccount:team-a:ctl"
    );

    // A token for another audience is not an API credential; a default one is.
    let status_of =
        |r: RawApi| async move { r.get("/api/v1/namespaces/team-a/configmaps").await.status };
    assert_eq!(status_of(tc.raw_as(&token).await).await, 401);
    let out = kubectl_with(
        &tc,
        &tc.kubeconfig,
        &["create", "token", "ctl", "-n", "team-a"],
    )
    .await;
    assert!(
        out.status.success(),
        "kubectl create token: {}",
        text(&out.stderr)
    );
    let api_token = text(&out.stdout);
    let claims = jwt_payload(&api_token);
    assert_eq!(claims["aud"], json!([API_AUDIENCE]));
    assert_eq!(
        claims["exp"].as_i64().expect("exp") - claims["iat"].as_i64().expect("iat"),
        3600
    );
    // Authenticated but not yet authorized: 403, not 401.
    assert_eq!(status_of(tc.raw_as(&api_token).await).await, 403);

    // The API's own checks, through kube-rs.
    let sas = tc.api::<ServiceAccount>("team-a");
    let short: TokenRequest =
        from_json(json!({"spec": {"audiences": ["x"], "expirationSeconds": 60}}));
    let err = api_error(
        sas.create_token_request("ctl", &PostParams::default(), &short)
            .await,
    );
    assert_eq!(err.code, 422, "{err:?}");
    assert!(
        err.message.contains("less than 10 minutes"),
        "{}",
        err.message
    );
    let ok: TokenRequest =
        from_json(json!({"spec": {"audiences": ["x"], "expirationSeconds": 600}}));
    let missing = sas
        .create_token_request("nobody", &PostParams::default(), &ok)
        .await;
    assert_eq!(code(&missing), 404);
    let issued = sas
        .create_token_request("ctl", &PostParams::default(), &ok)
        .await
        .expect("token request");
    let status = issued.status.expect("TokenRequest status");
    assert_eq!(jwt_payload(&status.token)["aud"], json!(["x"]));
    let expires = status.expiration_timestamp.0.as_second();
    assert_eq!(
        expires,
        jwt_payload(&status.token)["exp"].as_i64().expect("exp")
    );
}

#[tokio::test]
async fn tokenreview_reports_identity_groups_and_audiences() {
    let tc = start_cluster().await;
    let sa = service_account(&tc, &["team-a"], "ctl").await;
    let token = tc
        .dc
        .issue_token("team-a", "ctl", &["ctrlhub", "other"], HOUR)
        .expect("issue token");

    let status = token_review(&tc, &token, &["ctrlhub", "third"]).await;
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(
        status["audiences"],
        json!(["ctrlhub"]),
        "only the intersection: {status}"
    );
    let user = &status["user"];
    assert_eq!(user["username"], "system:serviceaccount:team-a:ctl");
    assert_eq!(user["uid"], uid_of(&sa));
    assert_eq!(
        user["groups"],
        json!([
            "system:serviceaccounts",
            "system:serviceaccounts:team-a",
            "system:authenticated"
        ])
    );
    let credential = user["extra"]["authentication.kubernetes.io/credential-id"][0]
        .as_str()
        .expect("credential id");
    assert_eq!(
        credential,
        format!("JTI={}", jwt_payload(&token)["jti"].as_str().expect("jti"))
    );

    // Without spec.audiences the API server's audience is required and reported.
    let api_token = tc
        .dc
        .issue_token("team-a", "ctl", &[], HOUR)
        .expect("issue token");
    let status = token_review(&tc, &api_token, &[]).await;
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(status["audiences"], json!([API_AUDIENCE]));

    // The admin token reviews as the admin, a system:masters member.
    let status = token_review(&tc, "devcluster-admin", &[]).await;
    assert_eq!(status["authenticated"], true, "{status}");
    assert_eq!(status["user"]["username"], "devcluster-admin");
    assert!(
        status["user"]["groups"]
            .as_array()
            .expect("groups")
            .contains(&json!("system:masters")),
        "{status}"
    );

    // TokenReview is itself authorized: a ServiceAccount without a grant may not call it.
    let reviewer = client_as(&tc, &api_token).await;
    let denied = Api::<TokenReview>::all(reviewer.clone())
        .create(
            &PostParams::default(),
            &from_json(json!({"spec": {"token": token}})),
        )
        .await;
    assert_eq!(code(&denied), 403);
    create(
        &Api::<ClusterRole>::all(tc.client.clone()),
        json!({"metadata": {"name": "reviewer"},
               "rules": [{"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]}]}),
    )
    .await;
    bind(
        &tc,
        None,
        "reviewer",
        "ClusterRole",
        "reviewer",
        ("team-a", "ctl"),
    )
    .await;
    let allowed = Api::<TokenReview>::all(reviewer)
        .create(
            &PostParams::default(),
            &from_json(json!({"spec": {"token": token, "audiences": ["other"]}})),
        )
        .await
        .expect("granted TokenReview");
    let status = allowed.status.expect("status");
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(status.audiences, Some(vec!["other".to_string()]));
}

#[tokio::test]
async fn tokenreview_rejects_wrong_audience_expired_and_tampered_tokens() {
    let tc = start_cluster().await;
    service_account(&tc, &["team-a"], "ctl").await;
    create(
        &tc.api::<ServiceAccount>("team-a"),
        json!({"metadata": {"name": "admin-ish"}}),
    )
    .await;
    let good = tc
        .dc
        .issue_token("team-a", "ctl", &["ctrlhub"], HOUR)
        .expect("issue");

    // The control: the untouched token authenticates.
    let status = token_review(&tc, &good, &["ctrlhub"]).await;
    assert_eq!(status["authenticated"], true, "{status}");

    let rejected = |status: Value, why: &str| {
        assert_eq!(status["authenticated"], false, "{why}: {status}");
        assert!(
            status.get("audiences").is_none_or(Value::is_null),
            "{why}: {status}"
        );
        status["error"].as_str().expect("error").to_string()
    };

    let error = rejected(
        token_review(&tc, &good, &["someone-else"]).await,
        "wrong audience",
    );
    assert!(error.contains("audiences"), "{error}");

    let expired = tc
        .dc
        .issue_token("team-a", "ctl", &["ctrlhub"], Duration::ZERO)
        .expect("issue");
    let error = rejected(token_review(&tc, &expired, &["ctrlhub"]).await, "expired");
    assert!(error.contains("expired"), "{error}");

    // Another ServiceAccount's claims under this token's signature: a forgery.
    let other = tc
        .dc
        .issue_token("team-a", "admin-ish", &["ctrlhub"], HOUR)
        .expect("issue");
    let good_parts: Vec<&str> = good.split('.').collect();
    let other_parts: Vec<&str> = other.split('.').collect();
    let forged = format!("{}.{}.{}", other_parts[0], other_parts[1], good_parts[2]);
    let error = rejected(token_review(&tc, &forged, &["ctrlhub"]).await, "forged");
    assert!(error.contains("signature"), "{error}");

    // A token minted by another devcluster (another key) is worthless here.
    let stranger = start_cluster().await;
    service_account(&stranger, &["team-a"], "ctl").await;
    let foreign = stranger
        .dc
        .issue_token("team-a", "ctl", &["ctrlhub"], HOUR)
        .expect("issue");
    let error = rejected(
        token_review(&tc, &foreign, &["ctrlhub"]).await,
        "foreign key",
    );
    assert!(error.contains("signature"), "{error}");

    rejected(
        token_review(&tc, "not-a-token", &["ctrlhub"]).await,
        "garbage",
    );
}

#[tokio::test]
async fn requests_without_valid_token_get_401() {
    let tc = start_cluster().await;
    service_account(&tc, &["team-a"], "ctl").await;
    let path = "/api/v1/namespaces/team-a/configmaps";

    let config = tc.dc.kube_config().await.expect("kube config");
    let mut anonymous = reqwest::Client::builder();
    for der in config.root_cert.as_deref().unwrap_or_default() {
        anonymous =
            anonymous.add_root_certificate(reqwest::Certificate::from_der(der).expect("CA"));
    }
    let anonymous = anonymous.build().expect("client");
    let resp = anonymous
        .get(format!("{}{path}", tc.dc.url()))
        .send()
        .await
        .expect("send");
    assert_eq!(resp.status().as_u16(), 401, "no Authorization header");
    let body: Value = resp.json().await.expect("Status body");
    assert_eq!(body["kind"], "Status");
    assert_eq!(body["reason"], "Unauthorized");
    assert_eq!(body["code"], 401);

    let good = tc
        .dc
        .issue_token("team-a", "ctl", &[], HOUR)
        .expect("issue");
    let parts: Vec<&str> = good.split('.').collect();
    let tampered_sig = format!("{}.{}.{}x", parts[0], parts[1], parts[2]);
    let expired = tc
        .dc
        .issue_token("team-a", "ctl", &[], Duration::ZERO)
        .expect("issue");
    let for_other_audience = tc
        .dc
        .issue_token("team-a", "ctl", &["ctrlhub"], HOUR)
        .expect("issue");
    for (what, token) in [
        ("unknown static token", "devcluster-admin2"),
        ("malformed", "a.b"),
        ("bad signature", tampered_sig.as_str()),
        ("expired", expired.as_str()),
        (
            "audience is not the API server",
            for_other_audience.as_str(),
        ),
    ] {
        let r = tc.raw_as(token).await.get(path).await;
        assert_eq!(r.status, 401, "{what}: {:?}", r.body);
        assert_eq!(r.body["reason"], "Unauthorized", "{what}");
        // Discovery needs authentication too.
        assert_eq!(
            tc.raw_as(token).await.get("/apis").await.status,
            401,
            "{what}"
        );
    }

    // kube-rs sees the 401 as an API error.
    let client = client_as(&tc, &expired).await;
    let r = Api::<ConfigMap>::namespaced(client, "team-a")
        .list(&ListParams::default())
        .await;
    assert_eq!(code(&r), 401);

    // The control: the valid token authenticates (discovery is open to everyone authenticated).
    let r = tc.raw_as(&good).await.get("/apis").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let unauthenticated_before = tc.dc.auth_stats().unauthenticated;
    assert!(unauthenticated_before >= 11, "{:?}", tc.dc.auth_stats());
}

#[tokio::test]
async fn serviceaccount_is_forbidden_until_a_rolebinding_grants_it() {
    let tc = start_cluster().await;
    service_account(&tc, &["team-a"], "ctl").await;
    let token = tc
        .dc
        .issue_token("team-a", "ctl", &[], HOUR)
        .expect("issue");
    let cms = Api::<ConfigMap>::namespaced(client_as(&tc, &token).await, "team-a");
    let forbidden_before = tc.dc.auth_stats().forbidden;

    let err = api_error(cms.list(&ListParams::default()).await);
    assert_eq!(err.code, 403);
    assert_eq!(err.reason, "Forbidden");
    assert_eq!(
        err.message,
        "configmaps is forbidden: User \"system:serviceaccount:team-a:ctl\" cannot list resource \"configmaps\" in API group \"\" in the namespace \"team-a\""
    );
    assert!(tc.dc.auth_stats().forbidden > forbidden_before);

    role(
        &tc,
        Some("team-a"),
        "cm-reader",
        &["configmaps"],
        &["get", "list", "watch"],
    )
    .await;
    // A Role alone grants nothing.
    assert_eq!(code(&cms.list(&ListParams::default()).await), 403);
    bind(
        &tc,
        Some("team-a"),
        "ctl-reads",
        "Role",
        "cm-reader",
        ("team-a", "ctl"),
    )
    .await;

    // Effective on the next request: RBAC is read from the live store.
    let list = cms
        .list(&ListParams::default())
        .await
        .expect("granted list");
    assert!(list.items.is_empty());
    tc.api::<ConfigMap>("team-a")
        .create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": "c1"}})),
        )
        .await
        .expect("admin create");
    assert_eq!(
        cms.get("c1")
            .await
            .expect("granted get")
            .metadata
            .name
            .as_deref(),
        Some("c1")
    );
    // Only the granted verbs.
    let err = api_error(
        cms.create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": "c2"}})),
        )
        .await,
    );
    assert_eq!(err.code, 403);
    assert!(
        err.message
            .contains("cannot create resource \"configmaps\""),
        "{}",
        err.message
    );
    let err = api_error(cms.delete("c1", &DeleteParams::default()).await);
    assert_eq!(
        err.message,
        "configmaps \"c1\" is forbidden: User \"system:serviceaccount:team-a:ctl\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"team-a\""
    );

    // kubectl as the ServiceAccount sees the same.
    let kc = write_kubeconfig(
        &tc,
        "sa-kubeconfig",
        &tc.dc.kubeconfig_yaml_for_token(&token),
    );
    let out = kubectl_with(
        &tc,
        &kc,
        &["get", "configmaps", "-n", "team-a", "-o", "name"],
    )
    .await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "configmap/c1");
    let out = kubectl_with(&tc, &kc, &["get", "secrets", "-n", "team-a"]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("secrets is forbidden"),
        "{}",
        text(&out.stderr)
    );
}

#[tokio::test]
async fn rolebinding_to_clusterrole_grants_only_that_namespace() {
    let tc = start_cluster().await;
    service_account(&tc, &["team-a", "team-b"], "ctl").await;
    let token = tc
        .dc
        .issue_token("team-a", "ctl", &[], HOUR)
        .expect("issue");
    let client = client_as(&tc, &token).await;
    role(&tc, None, "cm-reader", &["configmaps"], &["list"]).await;
    // The binding lives in team-b: the grant is team-b's, not the ServiceAccount's namespace's.
    bind(
        &tc,
        Some("team-b"),
        "ctl-reads",
        "ClusterRole",
        "cm-reader",
        ("team-a", "ctl"),
    )
    .await;

    let in_b = Api::<ConfigMap>::namespaced(client.clone(), "team-b")
        .list(&ListParams::default())
        .await;
    assert_eq!(code(&in_b), 200);
    let in_a = Api::<ConfigMap>::namespaced(client.clone(), "team-a")
        .list(&ListParams::default())
        .await;
    assert_eq!(code(&in_a), 403);
    let err = api_error(
        Api::<ConfigMap>::all(client.clone())
            .list(&ListParams::default())
            .await,
    );
    assert_eq!(
        err.message,
        "configmaps is forbidden: User \"system:serviceaccount:team-a:ctl\" cannot list resource \"configmaps\" in API group \"\" at the cluster scope"
    );
    // Other resources stay closed in team-b too.
    let secrets = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(client, "team-b")
        .list(&ListParams::default())
        .await;
    assert_eq!(code(&secrets), 403);
}

#[tokio::test]
async fn all_namespace_list_needs_clusterrolebinding() {
    let tc = start_cluster().await;
    service_account(&tc, &["team-a", "team-b"], "ctl").await;
    let token = tc
        .dc
        .issue_token("team-a", "ctl", &[], HOUR)
        .expect("issue");
    let raw = tc.raw_as(&token).await;
    role(&tc, None, "cm-reader", &["configmaps"], &["list", "watch"]).await;
    for ns in ["team-a", "team-b"] {
        bind(
            &tc,
            Some(ns),
            "ctl-reads",
            "ClusterRole",
            "cm-reader",
            ("team-a", "ctl"),
        )
        .await;
        assert_eq!(
            raw.get(&format!("/api/v1/namespaces/{ns}/configmaps"))
                .await
                .status,
            200
        );
    }
    // RoleBindings in every namespace still do not make a cluster-scoped grant.
    assert_eq!(raw.get("/api/v1/configmaps").await.status, 403);
    assert_eq!(raw.watch("/api/v1/configmaps?watch=true").await.status, 403);

    bind(
        &tc,
        None,
        "ctl-reads-all",
        "ClusterRole",
        "cm-reader",
        ("team-a", "ctl"),
    )
    .await;
    let r = raw.get("/api/v1/configmaps").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    let mut watch = raw.watch("/api/v1/configmaps?watch=true").await;
    assert_eq!(watch.status, 200);
    tc.api::<ConfigMap>("team-b")
        .create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": "seen"}})),
        )
        .await
        .expect("admin create");
    let event = watch.next_event(PATIENCE).await.expect("an event");
    assert_eq!(event["type"], "ADDED");
    assert_eq!(event["object"]["metadata"]["name"], "seen");
}

/// One access question asked both ways.
struct Case {
    verb: &'static str,
    ns: &'static str,
    group: &'static str,
    resource: &'static str,
    sub: &'static str,
    name: &'static str,
    path: String,
}

fn case(
    verb: &'static str,
    ns: &'static str,
    group: &'static str,
    resource: &'static str,
    sub: &'static str,
    name: &'static str,
) -> Case {
    let prefix = if group.is_empty() {
        "/api/v1".to_string()
    } else {
        format!("/apis/{group}/v1")
    };
    let mut path = prefix;
    if !ns.is_empty() {
        path.push_str(&format!("/namespaces/{ns}"));
    }
    path.push_str(&format!("/{resource}"));
    if !name.is_empty() {
        path.push_str(&format!("/{name}"));
    }
    if !sub.is_empty() {
        path.push_str(&format!("/{sub}"));
    }
    Case {
        verb,
        ns,
        group,
        resource,
        sub,
        name,
        path,
    }
}

#[tokio::test]
async fn subjectaccessreview_matches_enforcement() {
    let tc = start_cluster().await;
    service_account(&tc, &["team-a", "team-b"], "ctl").await;
    let token = tc
        .dc
        .issue_token("team-a", "ctl", &[], HOUR)
        .expect("issue");
    let raw = tc.raw_as(&token).await;
    for (ns, name) in [("team-a", "one"), ("team-a", "two"), ("team-b", "one")] {
        tc.api::<ConfigMap>(ns)
            .create(
                &PostParams::default(),
                &from_json(json!({"metadata": {"name": name}})),
            )
            .await
            .expect("admin create");
    }
    // A named grant, a subresource-only grant, a group grant and a wildcard ClusterRole.
    create(
        &tc.api::<Role>("team-a"),
        json!({"metadata": {"name": "mixed"}, "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get"], "resourceNames": ["one"]},
            {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get"]},
        ]}),
    )
    .await;
    bind(
        &tc,
        Some("team-a"),
        "mixed",
        "Role",
        "mixed",
        ("team-a", "ctl"),
    )
    .await;
    create(
        &Api::<ClusterRole>::all(tc.client.clone()),
        json!({"metadata": {"name": "apps-all"}, "rules": [{"apiGroups": ["apps"], "resources": ["*"], "verbs": ["*"]}]}),
    )
    .await;
    create(
        &tc.api::<RoleBinding>("team-b"),
        json!({"metadata": {"name": "sa-group"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "apps-all"},
               "subjects": [{"kind": "Group", "name": "system:serviceaccounts:team-a", "apiGroup": "rbac.authorization.k8s.io"}]}),
    )
    .await;

    let cases = [
        case("get", "team-a", "", "configmaps", "", "one"),
        case("get", "team-a", "", "configmaps", "", "two"),
        case("list", "team-a", "", "configmaps", "", ""),
        case("get", "team-b", "", "configmaps", "", "one"),
        case("get", "team-a", "", "pods", "status", "p"),
        case("get", "team-a", "", "pods", "", "p"),
        case("list", "team-b", "apps", "deployments", "", ""),
        case("get", "team-b", "apps", "deployments", "scale", "d"),
        case("list", "team-a", "apps", "deployments", "", ""),
        case("list", "", "apps", "deployments", "", ""),
    ];
    let sar: Api<SubjectAccessReview> = Api::all(tc.client.clone());
    let mut seen = (0, 0);
    for c in &cases {
        let review = create_review(
            &sar,
            json!({"spec": {
                "user": "system:serviceaccount:team-a:ctl",
                "groups": ["system:serviceaccounts", "system:serviceaccounts:team-a", "system:authenticated"],
                "resourceAttributes": {"namespace": c.ns, "verb": c.verb, "group": c.group,
                                       "resource": c.resource, "subresource": c.sub, "name": c.name},
            }}),
        )
        .await;
        let status = review.status.expect("SAR status");
        let r = raw.get(&c.path).await;
        let enforced = r.status != 403;
        assert_eq!(
            status.allowed, enforced,
            "{} {}: SAR said {:?}, server answered {} {:?}",
            c.verb, c.path, status, r.status, r.body
        );
        if status.allowed {
            seen.0 += 1;
            assert!(
                status
                    .reason
                    .as_deref()
                    .unwrap_or_default()
                    .starts_with("RBAC: allowed by"),
                "{status:?}"
            );
        } else {
            seen.1 += 1;
        }
    }
    assert_eq!(
        seen,
        (4, 6),
        "the matrix covers both answers (allowed, denied)"
    );

    // Without groups the Group grant does not apply (SAR evaluates exactly what it is given).
    let review = create_review(
        &sar,
        json!({"spec": {"user": "system:serviceaccount:team-a:ctl",
                        "resourceAttributes": {"namespace": "team-b", "verb": "list", "group": "apps", "resource": "deployments"}}}),
    )
    .await;
    assert!(!review.status.expect("status").allowed);

    // Non-resource requests: discovery is open to authenticated users, other paths are not.
    for (path, allowed) in [("/apis", true), ("/metrics", false)] {
        let review = create_review(
            &sar,
            json!({"spec": {"user": "u", "groups": ["system:authenticated"],
                            "nonResourceAttributes": {"path": path, "verb": "get"}}}),
        )
        .await;
        assert_eq!(review.status.expect("status").allowed, allowed, "{path}");
    }

    // Asking about others is itself a privilege.
    let as_sa = Api::<SubjectAccessReview>::all(client_as(&tc, &token).await)
        .create(
            &PostParams::default(),
            &from_json(json!({"spec": {"user": "x", "resourceAttributes": {"verb": "get", "resource": "pods"}}})),
        )
        .await;
    assert_eq!(code(&as_sa), 403);
}

#[tokio::test]
async fn kubectl_auth_can_i_answers_for_a_serviceaccount() {
    let tc = start_cluster().await;
    service_account(&tc, &["team-a", "team-b"], "ctl").await;
    let token = tc
        .dc
        .issue_token("team-a", "ctl", &[], HOUR)
        .expect("issue");
    let kc = write_kubeconfig(
        &tc,
        "sa-kubeconfig",
        &tc.dc.kubeconfig_yaml_for_token(&token),
    );
    let can_i = |ns: &'static str| {
        let kc = kc.clone();
        let tc = &tc;
        async move {
            let out =
                kubectl_with(tc, &kc, &["auth", "can-i", "list", "configmaps", "-n", ns]).await;
            (text(&out.stdout), out.status.code())
        }
    };
    assert_eq!(can_i("team-a").await, ("no".to_string(), Some(1)));

    role(&tc, Some("team-a"), "cm-reader", &["configmaps"], &["list"]).await;
    bind(
        &tc,
        Some("team-a"),
        "ctl-reads",
        "Role",
        "cm-reader",
        ("team-a", "ctl"),
    )
    .await;
    assert_eq!(can_i("team-a").await, ("yes".to_string(), Some(0)));
    assert_eq!(can_i("team-b").await, ("no".to_string(), Some(1)));

    // whoami (SelfSubjectReview) names the ServiceAccount.
    let out = kubectl_with(&tc, &kc, &["auth", "whoami", "-o", "json"]).await;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let who: Value = serde_json::from_slice(&out.stdout).expect("whoami json");
    assert_eq!(
        who["status"]["userInfo"]["username"],
        "system:serviceaccount:team-a:ctl"
    );
}

#[tokio::test]
async fn deleting_the_binding_revokes_access() {
    let tc = start_cluster().await;
    service_account(&tc, &["team-a"], "ctl").await;
    let token = tc
        .dc
        .issue_token("team-a", "ctl", &[], HOUR)
        .expect("issue");
    let raw = tc.raw_as(&token).await;
    let path = "/api/v1/namespaces/team-a/configmaps";
    role(
        &tc,
        Some("team-a"),
        "cm-reader",
        &["configmaps"],
        &["list", "watch"],
    )
    .await;
    bind(
        &tc,
        Some("team-a"),
        "ctl-reads",
        "Role",
        "cm-reader",
        ("team-a", "ctl"),
    )
    .await;
    assert_eq!(raw.get(path).await.status, 200);
    let mut watch = raw.watch(&format!("{path}?watch=true")).await;
    assert_eq!(watch.status, 200);

    tc.api::<RoleBinding>("team-a")
        .delete("ctl-reads", &DeleteParams::default())
        .await
        .expect("delete binding");
    let r = raw.get(path).await;
    assert_eq!(r.status, 403, "revoked on the next request: {:?}", r.body);
    assert_eq!(raw.watch(&format!("{path}?watch=true")).await.status, 403);

    // As in Kubernetes, a watch authorized at its start is not cut by the revocation.
    tc.api::<ConfigMap>("team-a")
        .create(
            &PostParams::default(),
            &from_json(json!({"metadata": {"name": "after"}})),
        )
        .await
        .expect("admin create");
    let event = watch
        .next_event(PATIENCE)
        .await
        .expect("event on the open watch");
    assert_eq!(event["object"]["metadata"]["name"], "after");

    // Deleting the role (binding restored) revokes too; the reason names the missing role.
    bind(
        &tc,
        Some("team-a"),
        "ctl-reads",
        "Role",
        "cm-reader",
        ("team-a", "ctl"),
    )
    .await;
    assert_eq!(raw.get(path).await.status, 200);
    tc.api::<Role>("team-a")
        .delete("cm-reader", &DeleteParams::default())
        .await
        .expect("delete role");
    let r = raw.get(path).await;
    assert_eq!(r.status, 403);
    assert!(
        r.body["message"]
            .as_str()
            .unwrap_or_default()
            .contains("role.rbac.authorization.k8s.io \"cm-reader\" not found"),
        "{:?}",
        r.body
    );
}

#[tokio::test]
async fn deleted_serviceaccount_token_stops_working() {
    let tc = start_cluster().await;
    service_account(&tc, &["team-a"], "ctl").await;
    let token = tc
        .dc
        .issue_token("team-a", "ctl", &["ctrlhub", API_AUDIENCE], HOUR)
        .expect("issue");
    let raw = tc.raw_as(&token).await;
    let path = "/api/v1/namespaces/team-a/configmaps";
    assert_eq!(
        token_review(&tc, &token, &["ctrlhub"]).await["authenticated"],
        true
    );
    assert_eq!(
        raw.get(path).await.status,
        403,
        "authenticated, not authorized"
    );

    let sas = tc.api::<ServiceAccount>("team-a");
    sas.delete("ctl", &DeleteParams::default())
        .await
        .expect("delete SA");
    let status = token_review(&tc, &token, &["ctrlhub"]).await;
    assert_eq!(status["authenticated"], false, "{status}");
    assert!(
        status["error"]
            .as_str()
            .unwrap_or_default()
            .contains("deleted"),
        "{status}"
    );
    assert_eq!(raw.get(path).await.status, 401);

    // A new ServiceAccount of the same name has a new uid: the old token stays dead.
    create(&sas, json!({"metadata": {"name": "ctl"}})).await;
    assert_eq!(
        token_review(&tc, &token, &["ctrlhub"]).await["authenticated"],
        false
    );
    assert_eq!(raw.get(path).await.status, 401);
    let fresh = tc
        .dc
        .issue_token("team-a", "ctl", &["ctrlhub"], HOUR)
        .expect("issue");
    assert_eq!(
        token_review(&tc, &fresh, &["ctrlhub"]).await["authenticated"],
        true
    );
}

#[tokio::test]
async fn tokenreview_failures_can_be_injected() {
    let tc = start_cluster().await;
    service_account(&tc, &["team-a"], "ctl").await;
    let token = tc
        .dc
        .issue_token("team-a", "ctl", &["ctrlhub"], HOUR)
        .expect("issue");
    tc.dc.faults().fail_next("create", "tokenreviews", 1, 503);
    // Raw HTTP: kube-rs would retry a 503 behind our back.
    let path = "/apis/authentication.k8s.io/v1/tokenreviews";
    let review = json!({"spec": {"token": token, "audiences": ["ctrlhub"]}});
    let failed = tc.raw.post(path, &review).await;
    assert_eq!(
        failed.status, 503,
        "the injected failure: {:?}",
        failed.body
    );
    assert_eq!(failed.body["reason"], "ServiceUnavailable");
    let status = token_review(&tc, &token, &["ctrlhub"]).await;
    assert_eq!(
        status["authenticated"], true,
        "only the next one fails: {status}"
    );
}
