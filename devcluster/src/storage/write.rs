//! Writes to existing and new objects: create (and create-on-apply), update, patch, server-side
//! apply and the scale subresource — preconditions, the status split, generation, managed
//! fields, finalizers that may not be added while deleting, and CRD registration.

use super::store::{EventType, State};
use crate::admission::fieldcheck::{self, FieldValidation};
use crate::admission::{defaults, validation};
use crate::apply::fieldmanager;
use crate::apply::lists::list_key_of;
use crate::apply::patch;
use crate::catalog::resources::{GroupResource, ResourceInfo, infos_from_crd};
use crate::catalog::schema;
use crate::meta;
use crate::status::{ApiError, Cause};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Options shared by create, update and patch.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// The field manager recorded in managedFields.
    pub(crate) manager: String,
    /// `dryRun=All`: validate and answer, store nothing.
    pub(crate) dry_run: bool,
    /// `force=true` for server-side apply.
    pub(crate) force: bool,
    /// What to do with fields the kind's schema does not declare.
    pub(crate) field_validation: FieldValidation,
    /// Warnings for the response's `Warning` headers (unknown fields under `Warn`).
    pub(crate) warnings: Arc<parking_lot::Mutex<Vec<String>>>,
}

impl WriteOptions {
    /// Options for writes by field manager `manager`, with every other option at its default
    /// (not a dry run, no force, `fieldValidation=Warn`).
    pub fn new(manager: &str) -> Self {
        WriteOptions {
            manager: manager.to_string(),
            ..Default::default()
        }
    }

    /// Type-checks an object against its kind's schema, drops undeclared fields and applies
    /// `fieldValidation` to them.
    fn decode_check(&self, info: &ResourceInfo, obj: &mut Value) -> Result<(), ApiError> {
        let unknown = fieldcheck::check(info, obj)?;
        self.enforce(info, &unknown)
    }

    fn enforce(&self, info: &ResourceInfo, unknown: &[String]) -> Result<(), ApiError> {
        let warnings = fieldcheck::enforce(info, self.field_validation, unknown)?;
        self.warnings.lock().extend(warnings);
        Ok(())
    }
}

/// A patch request's body, by content type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PatchType {
    /// application/merge-patch+json
    Merge,
    /// application/json-patch+json
    Json,
    /// application/strategic-merge-patch+json
    Strategic,
    /// application/apply-patch+yaml
    Apply,
}

/// One write to the store: the resource version it addresses, where, and how. Every write
/// (create, update, patch, apply, scale) takes one.
pub struct Write<'a> {
    /// The resource version the request addressed (its kind, schema and subresources).
    pub info: &'a ResourceInfo,
    /// The URL's namespace; empty for cluster-scoped resources, or for a create whose body names
    /// the namespace.
    pub namespace: &'a str,
    /// The URL's object name; empty for a create (the body names the object).
    pub name: &'a str,
    /// `status` or `scale`, or None for the object itself.
    pub subresource: Option<&'a str>,
    /// Field manager, dry run, force and field validation.
    pub options: &'a WriteOptions,
}

impl<'a> Write<'a> {
    /// A create in `namespace` (empty: cluster-scoped, or as the body says).
    pub fn create(info: &'a ResourceInfo, namespace: &'a str, options: &'a WriteOptions) -> Self {
        Write {
            info,
            namespace,
            name: "",
            subresource: None,
            options,
        }
    }

    /// A write to the object `namespace/name`, or to its subresource.
    pub(crate) fn to(
        info: &'a ResourceInfo,
        namespace: &'a str,
        name: &'a str,
        subresource: Option<&'a str>,
        options: &'a WriteOptions,
    ) -> Self {
        Write {
            info,
            namespace,
            name,
            subresource,
            options,
        }
    }
}

/// Whether a write records its manager in `managedFields` as an update (create, update, patch,
/// scale), or leaves that to server-side apply, which computed them already.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fields {
    Record,
    Applied,
}

impl State {
    fn namespace_gate(&self, info: &ResourceInfo, ns: &str) -> Result<(), ApiError> {
        if !info.namespaced {
            return Ok(());
        }
        let ns_gr = GroupResource::new("", "namespaces");
        match self.get(&ns_gr, "", ns) {
            None => Err(ApiError::not_found("", "namespaces", ns)),
            Some(n) if meta::is_deleting(&n) => Err(ApiError::forbidden(format!(
                "{} \"{}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                info.plural, "",
            ))
            .with_name_hint(ns)),
            Some(_) => Ok(()),
        }
    }

    /// Create an object (POST).
    pub fn create(&mut self, w: &Write, mut obj: Value) -> Result<Arc<Value>, ApiError> {
        self.create_new(w, &mut obj, Fields::Record)
    }

    /// Create, or create-on-apply: checks, server-set metadata, defaults, validation, commit.
    fn create_new(
        &mut self,
        w: &Write,
        obj: &mut Value,
        fields: Fields,
    ) -> Result<Arc<Value>, ApiError> {
        let (info, opts) = (w.info, w.options);
        check_type(info, obj)?;
        opts.decode_check(info, obj)?;
        let ns = normalize_namespace(info, w.namespace, obj)?;
        let name = name_or_generated(info, obj)?;
        if !info.builtin {
            // Built-in names are checked per kind by validation::validate.
            validation::custom_resource_name(info, &name)?;
        }
        self.namespace_gate(info, &ns)
            .map_err(|e| e.with_resource_name(&name))?;
        let now = self.clock.timestamp();
        set_server_metadata(info, obj, &now);
        defaults::on_create(info, obj, &now)?;
        validation::validate(info, obj, None)?;
        check_custom(info, obj, &name, opts)?;
        let gr = info.group_resource();
        // Like kube-apiserver, an invalid object is refused as invalid even if the name is taken.
        if self.get(&gr, &ns, &name).is_some() {
            return Err(ApiError::already_exists(&info.group, &info.plural, &name));
        }
        if fields == Fields::Record {
            record(obj, None, w, &now);
        }
        if opts.dry_run {
            return Ok(Arc::new(obj.clone()));
        }
        if is_crd(&gr) {
            self.register_crd(obj, &name)?;
        }
        Ok(self.commit(&gr, EventType::Added, obj.clone(), None))
    }

    fn register_crd(&mut self, crd: &Value, name: &str) -> Result<(), ApiError> {
        let infos = infos_from_crd(crd).map_err(|m| {
            ApiError::invalid_field(
                "CustomResourceDefinition",
                "apiextensions.k8s.io",
                name,
                "spec",
                "FieldValueInvalid",
                &m,
            )
        })?;
        self.registry.remove_crd(name);
        for info in infos {
            self.registry.insert(info);
        }
        Ok(())
    }

    /// Replace an object (PUT), on the main resource or a subresource.
    pub(crate) fn update(&mut self, w: &Write, mut obj: Value) -> Result<Arc<Value>, ApiError> {
        let info = w.info;
        check_type(info, &obj)?;
        let old = self.require(info, w.namespace, w.name)?;
        if meta::resource_version(&obj).is_empty() {
            if !info.unconditional_update {
                return Err(ApiError::invalid_field(
                    &info.kind,
                    &info.group,
                    w.name,
                    "metadata.resourceVersion",
                    "FieldValueInvalid",
                    "Invalid value: 0x0: must be specified for an update",
                ));
            }
            keep_resource_version(&mut obj, &old);
        }
        self.write_existing(w, old, obj, Fields::Record)
    }

    /// Patch an object (PATCH), including server-side apply and create-on-apply.
    pub(crate) fn patch(
        &mut self,
        w: &Write,
        kind: PatchType,
        body: &Value,
    ) -> Result<Arc<Value>, ApiError> {
        let existing = self.get(&w.info.group_resource(), w.namespace, w.name);
        if kind == PatchType::Apply {
            return self.apply(w, existing, body);
        }
        let old =
            existing.ok_or_else(|| ApiError::not_found(&w.info.group, &w.info.plural, w.name))?;
        let mut new = (*old).clone();
        patch_object(w, kind, &mut new, body)?;
        // A resourceVersion that differs from the live one can only have come from the patch body:
        // it is a precondition, checked in write_existing.
        if meta::resource_version(&new).is_empty() {
            keep_resource_version(&mut new, &old);
        }
        self.write_existing(w, old, new, Fields::Record)
    }

    /// Server-side apply: merge the apply configuration into the live object (or create it),
    /// with field ownership and conflicts computed by `apply::fieldmanager`.
    fn apply(
        &mut self,
        w: &Write,
        existing: Option<Arc<Value>>,
        body: &Value,
    ) -> Result<Arc<Value>, ApiError> {
        let (info, opts, name) = (w.info, w.options, w.name);
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the body of an apply patch must be a YAML or JSON object",
            ));
        }
        check_type(info, body)?;
        // Undeclared fields are dropped before ownership is computed, so nobody owns them.
        let mut body = body.clone();
        opts.decode_check(info, &mut body)?;
        let body_name = meta::name(&body);
        if !body_name.is_empty() && body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if opts.manager.is_empty() {
            return Err(ApiError::bad_request(
                "PATCH requests with apply content type must include fieldManager",
            ));
        }
        let now = self.clock.timestamp();
        let api_version = info.api_version();
        let list_key = |path: &[&str]| list_key_of(info, path);
        let op = fieldmanager::Op {
            manager: &opts.manager,
            api_version: &api_version,
            time: &now,
            subresource: w.subresource,
            list_key: &list_key,
        };
        let merged = fieldmanager::apply(existing.as_deref(), &body, opts.force, &op)
            .map_err(apply_error)?;
        match existing {
            None => {
                let mut obj = merged;
                meta::set(&mut obj, "name", Some(json!(name)));
                if info.namespaced {
                    meta::set(&mut obj, "namespace", Some(json!(w.namespace)));
                }
                self.create_new(w, &mut obj, Fields::Applied)
            }
            Some(old) => {
                let mut new = merged;
                keep_resource_version(&mut new, &old);
                self.write_existing(w, old, new, Fields::Applied)
            }
        }
    }

    /// Read the scale subresource.
    pub(crate) fn get_scale(
        &self,
        info: &ResourceInfo,
        ns: &str,
        name: &str,
    ) -> Result<Value, ApiError> {
        let obj = self.require(info, ns, name)?;
        scale_of(info, &obj)
    }

    /// Write the scale subresource from a Scale object.
    pub(crate) fn set_scale(&mut self, w: &Write, scale: &Value) -> Result<Value, ApiError> {
        let (info, name) = (w.info, w.name);
        let paths = info
            .scale
            .clone()
            .ok_or_else(|| ApiError::no_route("scale"))?;
        let old = self.require(info, w.namespace, name)?;
        let replicas = scale
            .pointer("/spec/replicas")
            .and_then(Value::as_i64)
            .ok_or_else(|| {
                ApiError::invalid_field(
                    "Scale",
                    "autoscaling",
                    name,
                    "spec.replicas",
                    "FieldValueRequired",
                    "Required value",
                )
            })?;
        if replicas < 0 {
            return Err(ApiError::invalid_field(
                "Scale",
                "autoscaling",
                name,
                "spec.replicas",
                "FieldValueInvalid",
                "Invalid value: must be greater than or equal to 0",
            ));
        }
        let given = meta::resource_version(scale);
        if !given.is_empty() && given != meta::resource_version(&old) {
            return Err(modified(info, name));
        }
        let mut new = (*old).clone();
        meta::set_path(&mut new, &paths.spec_replicas, json!(replicas));
        // The scale write is a write of the object itself, not of a subresource.
        let main = Write {
            subresource: None,
            ..*w
        };
        let updated = self.write_existing(&main, old, new, Fields::Record)?;
        scale_of(info, &updated)
    }

    /// The common end of update, patch, apply and scale: preconditions, the status split,
    /// server-owned fields, finalizers, validation, generation, managed fields, commit — or
    /// removal, when the last finalizer of an object being deleted goes.
    fn write_existing(
        &mut self,
        w: &Write,
        old: Arc<Value>,
        mut new: Value,
        fields: Fields,
    ) -> Result<Arc<Value>, ApiError> {
        let (info, opts, sub) = (w.info, w.options, w.subresource);
        opts.decode_check(info, &mut new)?;
        check_identity(w, &old, &mut new)?;
        new["apiVersion"] = old.get("apiVersion").cloned().unwrap_or(Value::Null);
        new["kind"] = json!(info.kind);
        let mut new = split_status(w, &old, new)?;
        keep_server_fields(&old, &mut new);
        let deleting = meta::is_deleting(&old);
        if deleting {
            no_new_finalizers(w, &old, &new)?;
        }
        if sub.is_none() {
            validation::validate(info, &new, Some(&old))?;
            check_custom(info, &mut new, w.name, opts)?;
        }
        if info.generation && spec_changed(info, &old, &new) {
            let generation = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            meta::set(&mut new, "generation", Some(json!(generation + 1)));
        }
        if same_ignoring_managed_fields(&old, &new) {
            return Ok(old);
        }
        match fields {
            Fields::Record => record(&mut new, Some(&old), w, &self.clock.timestamp()),
            Fields::Applied => {
                if let Some(mf) = old.pointer("/metadata/managedFields")
                    && new.pointer("/metadata/managedFields").is_none()
                {
                    meta::set(&mut new, "managedFields", Some(mf.clone()));
                }
            }
        }
        if opts.dry_run {
            return Ok(Arc::new(new));
        }
        let gr = info.group_resource();
        if is_crd(&gr) && sub.is_none() {
            self.register_crd(&new, w.name)?;
        }
        if deleting && meta::finalizers(&new).is_empty() {
            return Ok(self.remove(&gr, new, old));
        }
        Ok(self.commit(&gr, EventType::Modified, new, Some(old)))
    }
}

fn is_crd(gr: &GroupResource) -> bool {
    gr.group == "apiextensions.k8s.io" && gr.resource == "customresourcedefinitions"
}

/// The 409 of a write whose resourceVersion precondition failed.
fn modified(info: &ResourceInfo, name: &str) -> ApiError {
    ApiError::conflict(
        &info.group,
        &info.plural,
        name,
        "the object has been modified; please apply your changes to the latest version and try again",
    )
}

/// A write without a resourceVersion is unconditional: it is taken as the live one.
fn keep_resource_version(new: &mut Value, old: &Value) {
    meta::set(
        new,
        "resourceVersion",
        Some(json!(meta::resource_version(old))),
    );
}

/// The object's name, or one generated from `metadata.generateName` (422 when neither is set).
fn name_or_generated(info: &ResourceInfo, obj: &mut Value) -> Result<String, ApiError> {
    let name = meta::name(obj).to_string();
    if !name.is_empty() {
        return Ok(name);
    }
    let generate = obj
        .pointer("/metadata/generateName")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if generate.is_empty() {
        return Err(ApiError::invalid_field(
            &info.kind,
            &info.group,
            "",
            "metadata.name",
            "FieldValueRequired",
            "Required value: name or generateName is required",
        ));
    }
    let name = format!("{generate}{}", random_suffix());
    meta::set(obj, "name", Some(json!(name)));
    Ok(name)
}

/// The metadata a new object gets from the server (uid, creationTimestamp, generation 1), what a
/// client may not set on create (deletion fields, resourceVersion, selfLink), and no status
/// where status is a subresource.
fn set_server_metadata(info: &ResourceInfo, obj: &mut Value, now: &str) {
    let md = meta::metadata_mut(obj);
    md.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
    md.insert("creationTimestamp".into(), json!(now));
    for f in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "selfLink",
    ] {
        md.remove(f);
    }
    if info.generation {
        md.insert("generation".into(), json!(1));
    } else {
        md.remove("generation");
    }
    if md
        .get("finalizers")
        .is_some_and(|f| f.as_array().is_some_and(Vec::is_empty))
    {
        md.remove("finalizers");
    }
    if info.status
        && let Some(map) = obj.as_object_mut()
    {
        map.remove("status");
    }
}

/// A merge, JSON or strategic merge patch applied to `new` (the live object's copy).
fn patch_object(w: &Write, kind: PatchType, new: &mut Value, body: &Value) -> Result<(), ApiError> {
    let info = w.info;
    match kind {
        PatchType::Merge => {
            if !body.is_object() {
                return Err(ApiError::bad_request(
                    "the body of a merge patch must be a JSON object",
                ));
            }
            patch::merge_patch(new, body);
            Ok(())
        }
        PatchType::Json => patch::json_patch(new, body).map_err(|e| match e {
            patch::PatchError::Malformed(m) => ApiError::bad_request(m),
            patch::PatchError::Failed(m) => ApiError::invalid_field(
                &info.kind,
                &info.group,
                w.name,
                "",
                "FieldValueInvalid",
                &m,
            ),
        }),
        PatchType::Strategic => {
            if !info.builtin {
                return Err(ApiError::unsupported_media_type(
                    "application/strategic-merge-patch+json",
                ));
            }
            patch::strategic_merge_patch(new, body)
                .map_err(|e| ApiError::bad_request(e.to_string()))
        }
        // State::patch hands apply patches to State::apply before getting here.
        PatchType::Apply => Err(ApiError::unsupported_media_type(
            "application/apply-patch+yaml",
        )),
    }
}

/// An apply's conflicts as kube-apiserver's 409 (one cause per field), or its 400.
fn apply_error(e: fieldmanager::ApplyError) -> ApiError {
    match e {
        fieldmanager::ApplyError::Conflicts(conflicts) => {
            let (message, causes) = fieldmanager::conflict_status_parts(&conflicts);
            let field = |c: &Value, k: &str| c.get(k).and_then(Value::as_str).map(str::to_string);
            ApiError::apply_conflict(
                message,
                causes
                    .iter()
                    .map(|c| Cause {
                        reason: field(c, "type")
                            .unwrap_or_else(|| "FieldManagerConflict".to_string()),
                        message: field(c, "message").unwrap_or_default(),
                        field: field(c, "field").unwrap_or_default(),
                    })
                    .collect(),
            )
        }
        fieldmanager::ApplyError::Invalid(m) => ApiError::bad_request(m),
    }
}

/// The body names the URL's object, in the URL's namespace, at the live resourceVersion (the
/// precondition: 409 otherwise).
fn check_identity(w: &Write, old: &Value, new: &mut Value) -> Result<(), ApiError> {
    let (info, name, ns) = (w.info, w.name, w.namespace);
    if meta::name(new) != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta::name(new)
        )));
    }
    if info.namespaced {
        let body_ns = meta::namespace(new);
        if !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        meta::set(new, "namespace", Some(json!(ns)));
    }
    if meta::resource_version(new) != meta::resource_version(old) {
        return Err(modified(info, name));
    }
    Ok(())
}

/// The status split: a write to `status` changes only status (the rest is the live object's);
/// a write to the object keeps the live status where status is a subresource.
fn split_status(w: &Write, old: &Value, mut new: Value) -> Result<Value, ApiError> {
    match w.subresource {
        Some("status") => {
            let status = new.get("status").cloned();
            let mut only_status = old.clone();
            match status {
                Some(s) => only_status["status"] = s,
                None => {
                    if let Some(m) = only_status.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            // Status writers may still carry managedFields; everything else of metadata is ignored.
            Ok(only_status)
        }
        Some(other) => Err(ApiError::no_route(other)),
        None => {
            if w.info.status {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        if let Some(m) = new.as_object_mut() {
                            m.remove("status");
                        }
                    }
                }
            }
            Ok(new)
        }
    }
}

/// Fields the server owns are not the client's to change; an empty finalizer list is none.
fn keep_server_fields(old: &Value, new: &mut Value) {
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
    ] {
        meta::set(
            new,
            field,
            old.pointer(&format!("/metadata/{field}")).cloned(),
        );
    }
    if new
        .pointer("/metadata/finalizers")
        .is_some_and(|f| f.as_array().is_some_and(Vec::is_empty))
    {
        meta::set(new, "finalizers", None);
    }
}

/// An object being deleted may lose finalizers but not gain them (422).
fn no_new_finalizers(w: &Write, old: &Value, new: &Value) -> Result<(), ApiError> {
    let before: BTreeSet<String> = meta::finalizers(old).into_iter().collect();
    let added: Vec<String> = meta::finalizers(new)
        .into_iter()
        .filter(|f| !before.contains(f))
        .collect();
    if added.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid_field(
        &w.info.kind,
        &w.info.group,
        w.name,
        "metadata.finalizers",
        "FieldValueForbidden",
        &format!(
            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
        ),
    ))
}

/// Prune, default and validate a custom resource against its CRD's structural schema.
fn check_custom(
    info: &ResourceInfo,
    obj: &mut Value,
    name: &str,
    opts: &WriteOptions,
) -> Result<(), ApiError> {
    let Some(schema) = &info.schema else {
        return Ok(());
    };
    let pruned = schema::prune_and_default(obj, schema);
    opts.enforce(info, &pruned)?;
    let causes = schema::validate(obj, schema);
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(
        &info.kind,
        &info.group,
        name,
        causes
            .into_iter()
            .map(|c| Cause {
                reason: c.reason.to_string(),
                message: c.message,
                field: c.field,
            })
            .collect(),
    ))
}

impl ApiError {
    fn with_name_hint(mut self, ns: &str) -> Self {
        self.details = Some(Box::new(json!({"name": ns, "kind": "namespaces"})));
        self
    }

    fn with_resource_name(mut self, name: &str) -> Self {
        if self.code == 403 {
            self.message = self.message.replacen("\"\"", &format!("\"{name}\""), 1);
        }
        self
    }
}

fn check_type(info: &ResourceInfo, obj: &Value) -> Result<(), ApiError> {
    if !obj.is_object() {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    }
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or_default();
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if !kind.is_empty() && kind != info.kind {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({}) or the kind {kind} does not match {}",
            info.api_version(),
            info.kind
        )));
    }
    if !api_version.is_empty() && api_version != info.api_version() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) does not match the expected API version ({})",
            info.api_version()
        )));
    }
    Ok(())
}

fn normalize_namespace(
    info: &ResourceInfo,
    url_ns: &str,
    obj: &mut Value,
) -> Result<String, ApiError> {
    obj["apiVersion"] = json!(info.api_version());
    obj["kind"] = json!(info.kind);
    if !info.namespaced {
        meta::set(obj, "namespace", None);
        return Ok(String::new());
    }
    let body_ns = meta::namespace(obj).to_string();
    if !body_ns.is_empty() && !url_ns.is_empty() && body_ns != url_ns {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let ns = if url_ns.is_empty() {
        body_ns
    } else {
        url_ns.to_string()
    };
    if ns.is_empty() {
        return Err(ApiError::bad_request(
            "a namespace is required for namespaced resources",
        ));
    }
    meta::set(obj, "namespace", Some(json!(ns)));
    Ok(ns)
}

fn random_suffix() -> String {
    use rand::Rng;
    // The alphabet kube-apiserver uses: no vowels, no confusable digits.
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

/// Whether anything but metadata (and status, where status is a subresource) differs.
fn spec_changed(info: &ResourceInfo, old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        if let Some(m) = v.as_object_mut() {
            m.remove("metadata");
            if info.status {
                m.remove("status");
            }
        }
        v
    };
    strip(old) != strip(new)
}

fn same_ignoring_managed_fields(old: &Value, new: &Value) -> bool {
    let strip = |v: &Value| -> Value {
        let mut v = v.clone();
        meta::set(&mut v, "managedFields", None);
        v
    };
    strip(old) == strip(new)
}

/// Records the writer as an update manager in `managedFields` (nothing without a manager).
fn record(obj: &mut Value, old: Option<&Value>, w: &Write, now: &str) {
    let (info, opts) = (w.info, w.options);
    if opts.manager.is_empty() {
        return;
    }
    if let Some(old) = old
        && let Some(mf) = old.pointer("/metadata/managedFields")
    {
        meta::set(obj, "managedFields", Some(mf.clone()));
    }
    let api_version = info.api_version();
    let list_key = |path: &[&str]| list_key_of(info, path);
    let op = fieldmanager::Op {
        manager: &opts.manager,
        api_version: &api_version,
        time: now,
        subresource: w.subresource,
        list_key: &list_key,
    };
    fieldmanager::record_update(old, obj, &op);
}

fn scale_of(info: &ResourceInfo, obj: &Value) -> Result<Value, ApiError> {
    let paths = info
        .scale
        .clone()
        .ok_or_else(|| ApiError::no_route("scale"))?;
    let spec = meta::get_path(obj, &paths.spec_replicas)
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let status = meta::get_path(obj, &paths.status_replicas)
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let mut scale = json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": {
            "name": meta::name(obj),
            "uid": meta::uid(obj),
            "resourceVersion": meta::resource_version(obj),
            "creationTimestamp": obj.pointer("/metadata/creationTimestamp").cloned().unwrap_or(Value::Null),
        },
        "spec": {"replicas": spec},
        "status": {"replicas": status},
    });
    if info.namespaced {
        scale["metadata"]["namespace"] = json!(meta::namespace(obj));
    }
    let selector = paths
        .label_selector
        .as_deref()
        .and_then(|p| meta::get_path(obj, p))
        .cloned()
        .or_else(|| {
            // Built-in workloads keep a LabelSelector object in spec.selector; Scale wants it serialized.
            obj.pointer("/spec/selector/matchLabels")
                .and_then(Value::as_object)
                .map(|m| {
                    json!(
                        m.iter()
                            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                            .collect::<Vec<_>>()
                            .join(",")
                    )
                })
        });
    if let Some(sel) = selector {
        scale["status"]["selector"] = sel;
    }
    Ok(scale)
}
