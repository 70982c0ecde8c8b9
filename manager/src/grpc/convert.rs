//! Conversions between `ctrlhub.v1` messages and the manager's domain types, in one place at
//! the gRPC edge: protobuf types stop here. Everything is a pure function, tested below without
//! a server; errors are [`Invalid`] naming the offending field so the user knows what to change.

use crate::dispatch::dispatcher::{Payload, Request, RevokeReason, TraceContext};
use crate::dispatch::event_queue::Delivery;
use crate::dispatch::queue::{Outcome, Reason};
use crate::dispatch::register_error::RegisterError;
use crate::registration::predicate::{
    self, LabelSelector, LabelSelectorRequirement, Predicate, SelectorOperator,
};
use crate::registration::{
    Backoff, Invalid, Mapping, Mode, NamespaceScope, Registration, ResourceRef, defaults,
};
use ctrlhub_proto::v1 as pb;
use std::time::{Duration, SystemTime};
use tonic::Status;

/// A manager message with `m` set.
pub(crate) fn msg(m: pb::manager_message::Message) -> pb::ManagerMessage {
    pb::ManagerMessage { message: Some(m) }
}

/// The message that carries `work` to a session: a piece alone as itself (what a session that
/// did not opt in to batches always gets), several as one [`pb::WorkBatch`].
pub(crate) fn bundle(mut work: Vec<pb::manager_message::Message>) -> pb::manager_message::Message {
    use pb::manager_message::Message as M;
    if work.len() == 1
        && let Some(one) = work.pop()
    {
        return one;
    }
    let mut batch = pb::WorkBatch::default();
    for piece in work {
        match piece {
            M::Reconcile(r) => batch.requests.push(r),
            M::Event(e) => batch.events.push(e),
            // Only work is bundled; anything else was never put in.
            _ => {}
        }
    }
    M::Batch(batch)
}

/// `register.mode`. MODE_EVENTS delivers the primary's own changes, so it takes no owns or
/// watches.
pub(crate) fn mode_from_pb(r: &pb::Register) -> Result<Mode, Invalid> {
    match pb::register::Mode::try_from(r.mode) {
        Ok(pb::register::Mode::Unspecified | pb::register::Mode::Reconcile) => Ok(Mode::Reconcile),
        Ok(pb::register::Mode::Events) => match events_mode_conflict(r) {
            Some(field) => Err(Invalid::new(
                field,
                "must be left empty with MODE_EVENTS, which delivers the primary's own changes, in order per key: owns and watches map to keys, and concurrency and backoff bound reconciles (use MODE_RECONCILE for those)",
            )),
            None => Ok(Mode::Events),
        },
        Err(_) => Err(Invalid::new(
            "register.mode",
            format!("unknown mode {}", r.mode),
        )),
    }
}

/// The first field set that MODE_EVENTS requires empty.
fn events_mode_conflict(r: &pb::Register) -> Option<&'static str> {
    [
        ("register.owns", !r.owns.is_empty()),
        ("register.watches", !r.watches.is_empty()),
        (
            "register.max_concurrent_reconciles",
            r.max_concurrent_reconciles != 0,
        ),
        ("register.backoff", r.backoff.is_some()),
    ]
    .into_iter()
    .find_map(|(field, set)| set.then_some(field))
}

/// How a watched resource names its primary (`field` is the watch's path).
pub(crate) fn mapping_from_pb(w: &pb::WatchedResource, field: &str) -> Result<Mapping, Invalid> {
    match &w.mapping {
        Some(pb::watched_resource::Mapping::LabelKey(k)) if !k.is_empty() => {
            Ok(Mapping::Label(k.clone()))
        }
        Some(pb::watched_resource::Mapping::AnnotationKey(k)) if !k.is_empty() => {
            Ok(Mapping::Annotation(k.clone()))
        }
        Some(pb::watched_resource::Mapping::FieldPath(p)) if !p.is_empty() => {
            Ok(Mapping::Field(p.trim_start_matches('.').to_string()))
        }
        _ => Err(Invalid::new(
            format!("{field}.mapping"),
            "set one of label_key, annotation_key or field_path (non-empty)",
        )),
    }
}

/// `register.namespaces`: unset means all namespaces.
pub(crate) fn namespaces_from_pb(
    scope: Option<&pb::NamespaceScope>,
) -> Result<NamespaceScope, Invalid> {
    match scope.and_then(|n| n.scope.as_ref()) {
        None | Some(pb::namespace_scope::Scope::All(_)) => Ok(NamespaceScope::All),
        Some(pb::namespace_scope::Scope::Names(n)) => {
            if n.names.is_empty() {
                return Err(Invalid::new(
                    "register.namespaces.names.names",
                    "must list at least one namespace (use `all` for every namespace)",
                ));
            }
            for (i, name) in n.names.iter().enumerate() {
                if !is_dns_label(name) {
                    return Err(Invalid::new(
                        format!("register.namespaces.names.names[{i}]"),
                        format!("{name:?} is not a valid namespace name"),
                    ));
                }
                if n.names[..i].contains(name) {
                    return Err(Invalid::new(
                        format!("register.namespaces.names.names[{i}]"),
                        format!("{name:?} is listed twice; entries must be unique"),
                    ));
                }
            }
            Ok(NamespaceScope::Names(n.names.clone()))
        }
        Some(pb::namespace_scope::Scope::LabelSelector(sel)) => Ok(NamespaceScope::Selector(
            translate_selector(sel, "register.namespaces.label_selector")?,
        )),
    }
}

/// `register.request_deadline`; unset means the default, and a set one must be positive (its
/// bounds per tenant are checked when the session attaches).
pub(crate) fn deadline_from_pb(d: Option<&prost_types::Duration>) -> Result<Duration, Invalid> {
    match d {
        None => Ok(defaults::DEADLINE),
        Some(d) => positive(d, "register.request_deadline"),
    }
}

/// A duration that must be set to more than zero.
fn positive(d: &prost_types::Duration, field: &str) -> Result<Duration, Invalid> {
    match duration(d, field)? {
        Some(d) if !d.is_zero() => Ok(d),
        _ => Err(Invalid::new(
            field,
            "must be positive; leave it unset for the default",
        )),
    }
}

/// `register.resync_period`; unset means the default, zero means never.
pub(crate) fn resync_from_pb(
    d: Option<&prost_types::Duration>,
) -> Result<Option<Duration>, Invalid> {
    Ok(match d {
        None => Some(defaults::RESYNC),
        Some(d) => duration(d, "register.resync_period")?.filter(|d| !d.is_zero()),
    })
}

/// `register.backoff`; unset fields keep the defaults, set ones must be positive and
/// base <= max.
pub(crate) fn backoff_from_pb(b: Option<&pb::Backoff>) -> Result<Backoff, Invalid> {
    let mut backoff = Backoff::default();
    let Some(b) = b else { return Ok(backoff) };
    if let Some(base) = b.base.as_ref() {
        backoff.base = positive(base, "register.backoff.base")?;
        if backoff.base < crate::registration::bounds::MIN_BACKOFF_BASE {
            return Err(Invalid::new(
                "register.backoff.base",
                format!(
                    "{:?} is below the minimum {:?}: a failing key is retried at most this often",
                    backoff.base,
                    crate::registration::bounds::MIN_BACKOFF_BASE
                ),
            ));
        }
    }
    if let Some(max) = b.max.as_ref() {
        backoff.max = positive(max, "register.backoff.max")?;
    }
    if backoff.base > backoff.max {
        return Err(Invalid::new(
            "register.backoff",
            format!(
                "base ({:?}) must not exceed max ({:?})",
                backoff.base, backoff.max
            ),
        ));
    }
    Ok(backoff)
}

/// A session's credits: what it asked for, 1 when it asked for none (the proto: "0 means 1").
pub(crate) fn credits(max_in_flight: u32) -> u32 {
    match max_in_flight {
        // The proto: "0 means 1".
        0 => defaults::MAX_IN_FLIGHT,
        credits => credits,
    }
}

/// `Registered.effective`: the Register as sent, with every setting the manager decided.
pub(crate) fn effective_to_pb(
    register: &pb::Register,
    registration: &Registration,
    credits: u32,
    ceiling: Option<&[String]>,
) -> pb::Register {
    let mut effective = register.clone();
    effective.mode = match registration.mode {
        Mode::Reconcile => pb::register::Mode::Reconcile,
        Mode::Events => pb::register::Mode::Events,
    } as i32;
    effective.primary = Some(resource_to_pb(&registration.primary));
    let refs: Vec<&ResourceRef> = registration
        .owns
        .iter()
        .map(|o| &o.resource)
        .chain(registration.watches.iter().map(|w| &w.resource))
        .collect();
    for owned in &mut effective.owns {
        fill_plural(owned.resource.as_mut(), &refs);
    }
    for watched in &mut effective.watches {
        fill_plural(watched.resource.as_mut(), &refs);
    }
    effective.namespaces = Some(effective_namespaces(register, ceiling));
    effective.max_concurrent_reconciles = registration.max_concurrent;
    effective.max_in_flight = credits;
    // What the manager applies: 0 stays 0 (no batches asked), anything else is capped.
    effective.max_batch = register.max_batch.min(super::connect::MAX_BATCH);
    effective.request_deadline =
        Some(prost_types::Duration::try_from(registration.deadline).unwrap_or_default());
    effective.resync_period = Some(
        prost_types::Duration::try_from(registration.resync.unwrap_or_default())
            .unwrap_or_default(),
    );
    // EVENTS mode has no retries, so no backoff to echo.
    effective.backoff = (registration.mode == Mode::Reconcile).then(|| pb::Backoff {
        base: prost_types::Duration::try_from(registration.backoff.base).ok(),
        max: prost_types::Duration::try_from(registration.backoff.max).ok(),
    });
    effective
}

/// The namespace scope as applied: unset means `all`, and `all` under a manager's
/// namespace ceiling (`--watch-namespace`) is the ceiling's names (nothing is narrowed without saying so).
fn effective_namespaces(register: &pb::Register, ceiling: Option<&[String]>) -> pb::NamespaceScope {
    use pb::namespace_scope::Scope;
    let asked = register.namespaces.as_ref().and_then(|n| n.scope.clone());
    let scope = match (asked, ceiling) {
        (None | Some(Scope::All(_)), Some(ceiling)) => Scope::Names(pb::namespace_scope::Names {
            names: ceiling.to_vec(),
        }),
        (None, None) => Scope::All(pb::namespace_scope::All {}),
        (Some(scope), _) => scope,
    };
    pb::NamespaceScope { scope: Some(scope) }
}

/// Sets the plural of `rt` from the registration's resolved resources of the same kind.
fn fill_plural(rt: Option<&mut pb::ResourceType>, resolved: &[&ResourceRef]) {
    let Some(rt) = rt else { return };
    if let Some(r) = resolved
        .iter()
        .find(|r| r.group == rt.group && r.version == rt.version && r.kind == rt.kind)
    {
        rt.plural = r.plural.clone();
    }
}

/// `Registered.readable`: every kind the session may read from the cache, once, with the form
/// it is cached and served in.
pub(crate) fn readable_to_pb(registration: &Registration) -> Vec<pb::ReadableResource> {
    registration
        .kinds()
        .into_iter()
        .map(|r| pb::ReadableResource {
            resource: Some(resource_to_pb(r)),
            metadata_only: registration.metadata_only(r),
        })
        .collect()
}

/// A Connect refused after its Register was read: answered with a `Rejected` message carrying
/// the field at fault, then this status (the proto: "the manager answers Rejected and closes").
#[derive(Debug)]
pub(crate) struct Rejection {
    /// The status the stream ends with; `Rejected` repeats its code and message.
    pub(crate) status: Status,
    /// The offending field's path, empty when no single field is at fault.
    pub(crate) field: String,
    /// Another definition runs under a higher or equal revision (`Rejected.outdated`).
    pub(crate) outdated: bool,
    /// Ring mode: the member that owns the controller (identity, address), where to dial.
    pub(crate) owner: Option<(String, String)>,
}

impl Rejection {
    /// Ring mode: another member owns the controller; dial it instead.
    pub(crate) fn redirect(identity: String, address: String) -> Self {
        let mut status = Status::unavailable(format!(
            "this ctrlhub member does not own this controller; member {identity} does: dial {address} (every ctrlhub SDK follows this at once, up to 3 redirects in a row)"
        ));
        owner_trailers(&mut status, &identity, &address);
        Rejection {
            status,
            field: String::new(),
            outdated: false,
            owner: Some((identity, address)),
        }
    }
}

impl From<Status> for Rejection {
    fn from(status: Status) -> Self {
        Rejection {
            status,
            field: String::new(),
            outdated: false,
            owner: None,
        }
    }
}

impl From<Invalid> for Rejection {
    fn from(i: Invalid) -> Self {
        Rejection {
            status: Status::invalid_argument(i.to_string()),
            field: i.field,
            outdated: false,
            owner: None,
        }
    }
}

impl From<RegisterError> for Rejection {
    fn from(e: RegisterError) -> Self {
        let status = match e {
            RegisterError::Invalid(i) => return i.into(),
            RegisterError::OutsideCeiling(m) => Status::permission_denied(m),
            limit @ RegisterError::Limit { .. } => Status::resource_exhausted(limit.to_string()),
            taken @ RegisterError::NameTaken { .. } => Status::already_exists(taken.to_string()),
            outdated @ RegisterError::Outdated { .. } => {
                return Rejection {
                    status: Status::failed_precondition(outdated.to_string()),
                    field: String::new(),
                    outdated: true,
                    owner: None,
                };
            }
            closing @ RegisterError::ShuttingDown => Status::unavailable(closing.to_string()),
        };
        status.into()
    }
}

impl Rejection {
    /// The `Rejected` message, then the status.
    pub(crate) fn messages(self) -> [Result<pb::ManagerMessage, Status>; 2] {
        let rejected = pb::Rejected {
            code: self.status.code() as i32,
            message: self.status.message().to_string(),
            field: self.field,
            outdated: self.outdated,
            owner_identity: self.owner.as_ref().map(|o| o.0.clone()).unwrap_or_default(),
            owner_address: self.owner.map(|o| o.1).unwrap_or_default(),
        };
        [
            Ok(msg(pb::manager_message::Message::Rejected(rejected))),
            Err(self.status),
        ]
    }
}

/// The `Revoked` message for `reason`, and the status the stream then ends with.
/// `new_leader` is the Lease holder when this manager knows it (for LEADERSHIP_LOST).
/// Where a revoked session goes next, when known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Next {
    /// Not known: reconnect through the configured address.
    Unknown,
    /// Leader mode: the new leader's identity.
    Leader(String),
    /// Ring mode: the member that owns the controller now.
    Owner {
        /// Its identity.
        identity: String,
        /// Its address (host:port).
        address: String,
    },
}

/// The trailers that tell a session where its controller's owner is: `ctrlhub-owner`,
/// `ctrlhub-owner-addr`, and `ctrlhub-leader` (which older SDKs log).
pub(crate) fn owner_trailers(status: &mut Status, identity: &str, address: &str) {
    let md = status.metadata_mut();
    for (key, value) in [
        ("ctrlhub-owner", identity),
        ("ctrlhub-owner-addr", address),
        ("ctrlhub-leader", identity),
    ] {
        if let Ok(v) = value.parse() {
            md.insert(key, v);
        }
    }
}

pub(crate) fn revoked_to_pb(
    reason: RevokeReason,
    message: String,
    next: Next,
) -> (pb::Revoked, Status) {
    use pb::revoked::Reason as R;
    let (r, status) = match reason {
        RevokeReason::LeadershipLost => (R::LeadershipLost, Status::unavailable(message.clone())),
        RevokeReason::Superseded => (R::Superseded, Status::failed_precondition(message.clone())),
        RevokeReason::ShuttingDown => (R::ShuttingDown, Status::unavailable(message.clone())),
        RevokeReason::PermissionRevoked => (
            R::PermissionRevoked,
            Status::permission_denied(message.clone()),
        ),
        RevokeReason::QuotaExceeded => (
            R::QuotaExceeded,
            Status::resource_exhausted(message.clone()),
        ),
        RevokeReason::CredentialsExpired => (
            R::CredentialsExpired,
            Status::unauthenticated(message.clone()),
        ),
        RevokeReason::UnitMoved => (R::UnitMoved, Status::unavailable(message.clone())),
    };
    let (leader_identity, owner_address) = match (reason, next) {
        (RevokeReason::LeadershipLost, Next::Leader(l)) => (l, String::new()),
        (RevokeReason::UnitMoved, Next::Owner { identity, address }) => (identity, address),
        _ => (String::new(), String::new()),
    };
    let mut status = status;
    if !owner_address.is_empty() {
        owner_trailers(&mut status, &leader_identity, &owner_address);
    }
    let revoked = pb::Revoked {
        reason: r as i32,
        code: status.code() as i32,
        message,
        leader_identity,
        owner_address,
    };
    (revoked, status)
}

/// tonic refuses an oversized message before reading it, with OUT_OF_RANGE; gRPC's code for a
/// message over the receiver's limit is RESOURCE_EXHAUSTED, and the user needs to know which knob.
pub(crate) fn inbound_error(e: Status) -> Status {
    if e.code() == tonic::Code::OutOfRange {
        Status::resource_exhausted(format!(
            "{}; send smaller messages or raise the manager's --max-message-bytes",
            e.message()
        ))
    } else {
        e
    }
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Longer durations mean "never" and are treated as this (a century), so that adding one to
/// `Instant::now()` or `SystemTime::now()` anywhere in the manager cannot overflow.
pub(crate) const LONGEST_DURATION: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

pub(crate) fn duration(
    d: &prost_types::Duration,
    field: &str,
) -> Result<Option<Duration>, Invalid> {
    if d.seconds < 0 || d.nanos < 0 {
        return Err(Invalid::new(field, "must not be negative"));
    }
    let secs = u64::try_from(d.seconds).map_err(|_| Invalid::new(field, "out of range"))?;
    let nanos = u32::try_from(d.nanos).map_err(|_| Invalid::new(field, "out of range"))?;
    let exact = Duration::from_secs(secs).saturating_add(Duration::from_nanos(u64::from(nanos)));
    Ok(Some(exact.min(LONGEST_DURATION)))
}

pub(crate) fn translate_selector(
    sel: &pb::LabelSelector,
    field: &str,
) -> Result<LabelSelector, Invalid> {
    let mut out = LabelSelector {
        match_labels: sel.match_labels.clone().into_iter().collect(),
        match_expressions: Vec::new(),
    };
    for (i, e) in sel.match_expressions.iter().enumerate() {
        let operator = match pb::label_selector_requirement::Operator::try_from(e.operator) {
            Ok(pb::label_selector_requirement::Operator::In) => SelectorOperator::In,
            Ok(pb::label_selector_requirement::Operator::NotIn) => SelectorOperator::NotIn,
            Ok(pb::label_selector_requirement::Operator::Exists) => SelectorOperator::Exists,
            Ok(pb::label_selector_requirement::Operator::DoesNotExist) => {
                SelectorOperator::DoesNotExist
            }
            _ => {
                return Err(Invalid::new(
                    format!("{field}.match_expressions[{i}].operator"),
                    "must be one of OPERATOR_IN, OPERATOR_NOT_IN, OPERATOR_EXISTS, OPERATOR_DOES_NOT_EXIST",
                ));
            }
        };
        out.match_expressions.push(LabelSelectorRequirement {
            key: e.key.clone(),
            operator,
            values: e.values.clone(),
        });
    }
    out.validate_at(field)
        .map_err(|e| Invalid::new(e.path().to_string(), e.detail()))?;
    Ok(out)
}

pub(crate) fn translate_predicate_opt(
    p: Option<&pb::Predicate>,
    field: &str,
) -> Result<Option<Predicate>, Invalid> {
    let Some(p) = p else { return Ok(None) };
    let out = translate_predicate(p, field, 0)?;
    out.validate_at(field)
        .map_err(|e| Invalid::new(e.path().to_string(), e.detail()))?;
    Ok(Some(out))
}

pub(crate) fn translate_predicate(
    p: &pb::Predicate,
    field: &str,
    depth: usize,
) -> Result<Predicate, Invalid> {
    use pb::predicate::Predicate as P;
    if depth > predicate::MAX_DEPTH {
        return Err(Invalid::new(
            field,
            format!(
                "predicate nesting exceeds the maximum depth of {}",
                predicate::MAX_DEPTH
            ),
        ));
    }
    let list = |ps: &[pb::Predicate], name: &str| -> Result<Vec<Predicate>, Invalid> {
        if ps.is_empty() {
            return Err(Invalid::new(
                format!("{field}.{name}.predicates"),
                "must have at least one child predicate",
            ));
        }
        ps.iter()
            .enumerate()
            .map(|(i, p)| {
                translate_predicate(p, &format!("{field}.{name}.predicates[{i}]"), depth + 1)
            })
            .collect()
    };
    Ok(match p.predicate.as_ref() {
        None => {
            return Err(Invalid::new(
                field,
                "set one predicate (e.g. generation_changed)",
            ));
        }
        Some(P::GenerationChanged(_)) => Predicate::GenerationChanged,
        Some(P::LabelsChanged(_)) => Predicate::LabelsChanged,
        Some(P::AnnotationsChanged(_)) => Predicate::AnnotationsChanged,
        Some(P::ResourceVersionChanged(_)) => Predicate::ResourceVersionChanged,
        Some(P::LabelSelector(sel)) => {
            Predicate::LabelSelector(translate_selector(sel, &format!("{field}.label_selector"))?)
        }
        Some(P::Deleting(_)) => Predicate::Deleting,
        Some(P::HasFinalizer(f)) => Predicate::HasFinalizer(f.name.clone()),
        Some(P::AllOf(a)) => Predicate::AllOf(list(&a.predicates, "all_of")?),
        Some(P::AnyOf(a)) => Predicate::AnyOf(list(&a.predicates, "any_of")?),
        Some(P::Negate(n)) => Predicate::Not(Box::new(translate_predicate(
            n,
            &format!("{field}.negate"),
            depth + 1,
        )?)),
    })
}

pub(crate) fn reason_to_pb(r: Reason) -> pb::reconcile_request::Reason {
    use pb::reconcile_request::Reason as R;
    match r {
        Reason::Created => R::Created,
        Reason::Updated => R::Updated,
        Reason::Deleted => R::Deleted,
        Reason::LeftScope => R::LeftScope,
        Reason::OwnedChanged => R::OwnedChanged,
        Reason::WatchedChanged => R::WatchedChanged,
        Reason::InitialList => R::InitialList,
        Reason::Resync => R::Resync,
        Reason::Scheduled | Reason::RequeueAfter => R::Requeue,
        Reason::Backoff => R::Retry,
        Reason::Redelivery => R::Redelivery,
    }
}

pub(crate) fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or(0),
    }
}

pub(crate) fn request_to_pb(r: &Request) -> pb::ReconcileRequest {
    use pb::reconcile_request::Reason as R;
    let mut reasons: Vec<i32> = r.reasons.iter().map(|x| reason_to_pb(*x) as i32).collect();
    let object = match &r.payload {
        Payload::None => None,
        Payload::Object(o) => Some(pb::reconcile_request::Object::ObjectJson(o.json().to_vec())),
        Payload::Tombstone(t) => {
            // A re-delivery of a gone key still says why it carries a tombstone.
            let gone = if t.left_scope {
                R::LeftScope
            } else {
                R::Deleted
            };
            if !reasons.contains(&(R::Deleted as i32)) && !reasons.contains(&(R::LeftScope as i32))
            {
                reasons.push(gone as i32);
            }
            Some(pb::reconcile_request::Object::Tombstone(pb::Tombstone {
                object_json: t.last.json().to_vec(),
                final_state_unknown: t.final_state_unknown,
            }))
        }
    };
    reasons.sort_unstable();
    reasons.dedup();
    pb::ReconcileRequest {
        id: r.id.clone(),
        key: Some(pb::ObjectKey {
            namespace: r.key.namespace.clone(),
            name: r.key.name.clone(),
        }),
        attempt: r.attempt,
        reasons,
        object,
        deadline: Some(timestamp(r.deadline)),
        traceparent: r.trace.traceparent.clone(),
        tracestate: r.trace.tracestate.clone(),
    }
}

pub(crate) fn event_to_pb(
    id: &str,
    d: &Delivery,
    deadline: SystemTime,
    trace: TraceContext,
) -> pb::Event {
    use crate::dispatch::event_queue::EventType as T;
    let kind = match d.event.kind {
        T::Added => pb::event::Type::Added,
        T::Modified => pb::event::Type::Modified,
        T::Deleted => pb::event::Type::Deleted,
        T::Sync => pb::event::Type::Sync,
    };
    pb::Event {
        id: id.to_string(),
        key: Some(pb::ObjectKey {
            namespace: d.key.namespace.clone(),
            name: d.key.name.clone(),
        }),
        r#type: kind as i32,
        object_json: d.event.object.json().to_vec(),
        sequence: d.event.sequence,
        attempt: d.attempt,
        deadline: Some(timestamp(deadline)),
        traceparent: trace.traceparent,
        tracestate: trace.tracestate,
    }
}

/// The controller's error text of a result, for the status page's recent errors.
pub(crate) fn result_message(r: &pb::ReconcileResult) -> &str {
    use pb::reconcile_result::Outcome as O;
    match r.outcome.as_ref() {
        Some(O::Error(e)) => &e.message,
        Some(O::Terminal(t)) => &t.message,
        _ => "",
    }
}

pub(crate) fn outcome_from_pb(r: &pb::ReconcileResult) -> Result<Outcome, Invalid> {
    use pb::reconcile_result::Outcome as O;
    Ok(match r.outcome.as_ref() {
        Some(O::Done(_)) => Outcome::Done,
        Some(O::RequeueAfter(ra)) => Outcome::RequeueAfter(
            ra.delay
                .as_ref()
                .map(|d| duration(d, "result.requeue_after.delay"))
                .transpose()?
                .flatten()
                .unwrap_or_default(),
        ),
        Some(O::Error(e)) => Outcome::Error {
            retry_after: e
                .retry_after
                .as_ref()
                .map(|d| duration(d, "result.error.retry_after"))
                .transpose()?
                .flatten(),
        },
        Some(O::Terminal(_)) => Outcome::Terminal,
        // An empty outcome is a controller bug; retrying is the safe reading.
        None => Outcome::Error { retry_after: None },
    })
}

pub(crate) fn resource_to_pb(r: &ResourceRef) -> pb::ResourceType {
    pb::ResourceType {
        group: r.group.clone(),
        version: r.version.clone(),
        kind: r.kind.clone(),
        plural: r.plural.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::ObjectKey;
    use crate::registration::{Owned, Watched};

    fn pb_duration(seconds: i64, nanos: i32) -> prost_types::Duration {
        prost_types::Duration { seconds, nanos }
    }

    fn configmaps() -> ResourceRef {
        ResourceRef {
            group: String::new(),
            version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
            namespaced: true,
        }
    }

    fn registration() -> Registration {
        Registration {
            name: "web".into(),
            mode: Mode::Reconcile,
            primary: configmaps(),
            owns: vec![Owned {
                resource: configmaps(),
                controller_only: true,
                predicate: None,
                metadata_only: true,
            }],
            watches: vec![
                Watched {
                    resource: configmaps(),
                    mapping: Mapping::Label("app".into()),
                    predicate: None,
                    metadata_only: false,
                },
                Watched {
                    resource: configmaps(),
                    mapping: Mapping::Field("spec.ref".into()),
                    predicate: None,
                    metadata_only: true,
                },
            ],
            namespaces: NamespaceScope::All,
            label_selector: None,
            predicate: None,
            max_concurrent: 4,
            deadline: Duration::from_secs(5),
            resync: None,
            backoff: Backoff::default(),
            include_object: true,
        }
    }

    #[test]
    fn durations_are_capped_so_no_deadline_can_overflow_the_clock() {
        let d = duration(
            &pb_duration(i64::MAX, 999_999_999),
            "register.request_deadline",
        )
        .ok()
        .flatten()
        .expect("accepted");
        assert_eq!(d, LONGEST_DURATION);
        assert!(std::time::Instant::now().checked_add(d).is_some());
        assert!(SystemTime::now().checked_add(d).is_some());
        assert_eq!(
            duration(&pb_duration(2, 500_000_000), "f").ok().flatten(),
            Some(Duration::from_millis(2500))
        );
        let err = duration(&pb_duration(-1, 0), "register.backoff.base").expect_err("negative");
        assert_eq!(err.field, "register.backoff.base");
    }

    #[test]
    fn events_mode_refuses_owns_and_watches_naming_the_field() {
        let mut r = pb::Register {
            mode: pb::register::Mode::Events as i32,
            ..Default::default()
        };
        assert_eq!(mode_from_pb(&r), Ok(Mode::Events));
        r.watches.push(pb::WatchedResource::default());
        assert_eq!(
            mode_from_pb(&r).expect_err("watches").field,
            "register.watches"
        );
        r.owns.push(pb::OwnedResource::default());
        assert_eq!(mode_from_pb(&r).expect_err("owns").field, "register.owns");
        r.mode = 99;
        assert_eq!(
            mode_from_pb(&r).expect_err("unknown").field,
            "register.mode"
        );
        r.mode = pb::register::Mode::Unspecified as i32;
        assert_eq!(mode_from_pb(&r), Ok(Mode::Reconcile));
    }

    #[test]
    fn a_watch_needs_a_non_empty_mapping() {
        let mut w = pb::WatchedResource {
            mapping: Some(pb::watched_resource::Mapping::FieldPath(".spec.ref".into())),
            ..Default::default()
        };
        assert_eq!(
            mapping_from_pb(&w, "register.watches[0]"),
            Ok(Mapping::Field("spec.ref".into())),
            "a leading dot is accepted and dropped"
        );
        w.mapping = Some(pb::watched_resource::Mapping::LabelKey(String::new()));
        let err = mapping_from_pb(&w, "register.watches[2]").expect_err("empty key");
        assert_eq!(err.field, "register.watches[2].mapping");
    }

    #[test]
    fn namespace_names_are_validated_one_by_one() {
        let names = |names: &[&str]| pb::NamespaceScope {
            scope: Some(pb::namespace_scope::Scope::Names(
                pb::namespace_scope::Names {
                    names: names.iter().map(|n| n.to_string()).collect(),
                },
            )),
        };
        assert_eq!(namespaces_from_pb(None), Ok(NamespaceScope::All));
        assert_eq!(
            namespaces_from_pb(Some(&names(&["team-a", "b2"]))),
            Ok(NamespaceScope::Names(vec!["team-a".into(), "b2".into()]))
        );
        let err = namespaces_from_pb(Some(&names(&["ok", "Not_OK"]))).expect_err("bad name");
        assert_eq!(err.field, "register.namespaces.names.names[1]");
        let err = namespaces_from_pb(Some(&names(&[]))).expect_err("empty");
        assert_eq!(err.field, "register.namespaces.names.names");
    }

    #[test]
    fn settings_left_unset_take_the_documented_defaults() {
        assert_eq!(deadline_from_pb(None), Ok(defaults::DEADLINE));
        assert_eq!(
            deadline_from_pb(Some(&pb_duration(7, 0))),
            Ok(Duration::from_secs(7))
        );
        assert_eq!(resync_from_pb(None), Ok(Some(defaults::RESYNC)));
        assert_eq!(
            resync_from_pb(Some(&pb_duration(0, 0))),
            Ok(None),
            "zero: never"
        );
        assert_eq!(backoff_from_pb(None), Ok(Backoff::default()));
        assert_eq!(credits(0), defaults::MAX_IN_FLIGHT);
        assert_eq!(credits(0), 1, "0 means 1, as the proto says");
        assert_eq!(credits(3), 3, "what the session asked for");
    }

    #[test]
    fn backoff_base_above_max_is_refused() {
        let b = pb::Backoff {
            base: Some(pb_duration(10, 0)),
            max: Some(pb_duration(1, 0)),
        };
        assert_eq!(
            backoff_from_pb(Some(&b)).expect_err("base > max").field,
            "register.backoff"
        );
        let b = pb::Backoff {
            base: Some(pb_duration(0, 1_000_000)),
            max: None,
        };
        let got = backoff_from_pb(Some(&b)).expect("valid");
        assert_eq!(got.base, Duration::from_millis(1));
        assert_eq!(got.max, Backoff::default().max);
    }

    #[test]
    fn selector_and_predicate_errors_name_their_field() {
        let sel = pb::LabelSelector {
            match_expressions: vec![pb::LabelSelectorRequirement {
                key: "tier".into(),
                operator: 42,
                values: vec![],
            }],
            ..Default::default()
        };
        let err = translate_selector(&sel, "register.label_selector").expect_err("operator");
        assert_eq!(
            err.field,
            "register.label_selector.match_expressions[0].operator"
        );
        let mut p = pb::Predicate {
            predicate: Some(pb::predicate::Predicate::GenerationChanged(
                Default::default(),
            )),
        };
        for _ in 0..=predicate::MAX_DEPTH {
            p = pb::Predicate {
                predicate: Some(pb::predicate::Predicate::Negate(Box::new(p))),
            };
        }
        let err = translate_predicate_opt(Some(&p), "register.predicate").expect_err("too deep");
        assert!(err.message.contains("maximum depth"), "{err}");
        let empty = pb::Predicate { predicate: None };
        let err =
            translate_predicate_opt(Some(&empty), "register.owns[0].predicate").expect_err("empty");
        assert_eq!(err.field, "register.owns[0].predicate");
    }

    #[test]
    fn registered_echoes_what_the_manager_decided() {
        let register = pb::Register {
            controller_name: "web".into(),
            include_object: true,
            ..Default::default()
        };
        let effective = effective_to_pb(&register, &registration(), 2, None);
        assert_eq!(effective.controller_name, "web");
        assert_eq!(
            effective.mode,
            pb::register::Mode::Reconcile as i32,
            "an unset mode is echoed as MODE_RECONCILE"
        );
        let primary = effective.primary.clone().expect("primary");
        assert!(!primary.plural.is_empty(), "the plural is filled in");
        assert!(
            matches!(
                effective.namespaces.as_ref().and_then(|n| n.scope.as_ref()),
                Some(pb::namespace_scope::Scope::All(_))
            ),
            "unset namespaces are echoed as all"
        );
        let ceiling = ["team-a".to_string()];
        let narrowed = effective_to_pb(&register, &registration(), 2, Some(&ceiling));
        assert!(
            matches!(
                narrowed.namespaces.and_then(|n| n.scope),
                Some(pb::namespace_scope::Scope::Names(n)) if n.names == ceiling
            ),
            "all under a namespace ceiling is echoed as the ceiling's names"
        );
        assert_eq!(effective.max_concurrent_reconciles, 4);
        assert_eq!(effective.max_in_flight, 2);
        assert_eq!(effective.request_deadline, Some(pb_duration(5, 0)));
        assert_eq!(
            effective.resync_period,
            Some(pb_duration(0, 0)),
            "no resync"
        );
        let backoff = effective.backoff.expect("echoed");
        assert_eq!(backoff.base, Some(pb_duration(0, 5_000_000)));
        let readable: Vec<bool> = readable_to_pb(&registration())
            .iter()
            .map(|r| r.metadata_only)
            .collect();
        // One kind, named once, in the form its primary needs.
        assert_eq!(readable, vec![false]);
    }

    fn kind(kind: &str) -> ResourceRef {
        ResourceRef {
            kind: kind.into(),
            plural: format!("{}s", kind.to_lowercase()),
            ..configmaps()
        }
    }

    fn owned(resource: ResourceRef, metadata_only: bool) -> Owned {
        Owned {
            resource,
            controller_only: true,
            predicate: None,
            metadata_only,
        }
    }

    fn watched(resource: ResourceRef, mapping: Mapping, metadata_only: bool) -> Watched {
        Watched {
            resource,
            mapping,
            predicate: None,
            metadata_only,
        }
    }

    #[test]
    fn each_kind_is_readable_once_in_full_unless_every_entry_asks_for_metadata() {
        let label = || Mapping::Label("app".into());
        let r = Registration {
            owns: vec![
                owned(kind("Deployment"), false),
                owned(kind("Service"), true),
                owned(kind("Secret"), true),
            ],
            watches: vec![
                watched(kind("Secret"), label(), false),
                watched(kind("Pod"), label(), true),
                watched(kind("Pod"), label(), true),
                watched(kind("Job"), Mapping::Field("spec.ref".into()), true),
            ],
            ..registration()
        };
        let readable: Vec<(String, bool)> = readable_to_pb(&r)
            .into_iter()
            .map(|x| {
                (
                    x.resource.map(|r| r.kind).unwrap_or_default(),
                    x.metadata_only,
                )
            })
            .collect();
        let expect = |k: &str, m: bool| (k.to_string(), m);
        assert_eq!(
            readable,
            vec![
                expect("ConfigMap", false),
                expect("Deployment", false),
                expect("Service", true),
                expect("Secret", false),
                expect("Pod", true),
                expect("Job", false),
            ],
            "children in full by default; metadata only when every entry asks; a field mapping reads the object"
        );
    }

    #[test]
    fn revocations_carry_the_status_the_stream_ends_with() {
        let (revoked, status) = revoked_to_pb(
            RevokeReason::PermissionRevoked,
            "role removed".into(),
            Next::Unknown,
        );
        assert_eq!(status.code(), tonic::Code::PermissionDenied);
        assert_eq!(revoked.code, tonic::Code::PermissionDenied as i32);
        assert_eq!(
            revoked.reason,
            pb::revoked::Reason::PermissionRevoked as i32
        );
        assert_eq!(revoked.message, "role removed");
        let (revoked, status) = revoked_to_pb(
            RevokeReason::LeadershipLost,
            String::new(),
            Next::Leader("m2".into()),
        );
        assert_eq!(revoked.leader_identity, "m2", "names the new leader");
        assert_eq!(
            status.code(),
            tonic::Code::Unavailable,
            "reconnect elsewhere"
        );
        let (_, status) = revoked_to_pb(RevokeReason::QuotaExceeded, String::new(), Next::Unknown);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
    }

    #[test]
    fn results_become_outcomes() {
        use pb::reconcile_result::Outcome as O;
        let result = |o: Option<O>| pb::ReconcileResult {
            id: "1".into(),
            outcome: o,
        };
        assert_eq!(
            outcome_from_pb(&result(Some(O::Done(Default::default())))),
            Ok(Outcome::Done)
        );
        let requeue = O::RequeueAfter(pb::reconcile_result::RequeueAfter {
            delay: Some(pb_duration(3, 0)),
        });
        assert_eq!(
            outcome_from_pb(&result(Some(requeue))),
            Ok(Outcome::RequeueAfter(Duration::from_secs(3)))
        );
        let error = O::Error(pb::reconcile_result::Error {
            message: "boom".into(),
            retry_after: Some(pb_duration(-1, 0)),
        });
        let err = outcome_from_pb(&result(Some(error.clone()))).expect_err("negative");
        assert_eq!(err.field, "result.error.retry_after");
        assert_eq!(result_message(&result(Some(error))), "boom");
        assert_eq!(
            outcome_from_pb(&result(None)),
            Ok(Outcome::Error { retry_after: None }),
            "an empty outcome is retried"
        );
    }

    #[test]
    fn a_tombstone_request_says_deleted_once_with_reasons_sorted() {
        let request = Request {
            id: "r1".into(),
            key: ObjectKey::new("ns", "a"),
            attempt: 2,
            reasons: vec![Reason::Redelivery, Reason::Updated, Reason::Backoff],
            payload: Payload::Tombstone(crate::dispatch::dispatcher::Tombstone {
                last: crate::informer::object::CachedObject::from_value(
                    &serde_json::json!({"metadata": {"name": "a"}}),
                ),
                final_state_unknown: true,
                left_scope: false,
            }),
            deadline: SystemTime::UNIX_EPOCH + Duration::from_secs(10),
            trace: TraceContext::default(),
        };
        let pb = request_to_pb(&request);
        let mut reasons = pb.reasons.clone();
        reasons.sort_unstable();
        reasons.dedup();
        assert_eq!(pb.reasons, reasons, "sorted and unique");
        assert!(
            pb.reasons
                .contains(&(pb::reconcile_request::Reason::Deleted as i32))
        );
        assert_eq!(pb.key.expect("key").name, "a");
        assert_eq!(
            pb.deadline,
            Some(prost_types::Timestamp {
                seconds: 10,
                nanos: 0
            })
        );
        match pb.object {
            Some(pb::reconcile_request::Object::Tombstone(t)) => {
                assert!(t.final_state_unknown);
                assert!(!t.object_json.is_empty());
            }
            other => panic!("expected a tombstone, got {other:?}"),
        }
    }

    #[test]
    fn oversized_messages_say_which_knob_to_turn() {
        let e = inbound_error(Status::out_of_range("message too large"));
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(
            e.message().contains("--max-message-bytes"),
            "{}",
            e.message()
        );
        assert_eq!(
            inbound_error(Status::cancelled("x")).code(),
            tonic::Code::Cancelled
        );
    }

    #[test]
    fn one_piece_goes_alone_and_several_go_as_one_batch_in_order() {
        use pb::manager_message::Message as M;
        let request = |id: &str| {
            M::Reconcile(pb::ReconcileRequest {
                id: id.into(),
                ..Default::default()
            })
        };
        assert!(matches!(bundle(vec![request("a")]), M::Reconcile(r) if r.id == "a"));
        let M::Batch(batch) = bundle(vec![request("a"), request("b"), request("c")]) else {
            panic!("several requests make a batch");
        };
        let ids: Vec<&str> = batch.requests.iter().map(|r| r.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert!(batch.events.is_empty());
        let event = |id: &str| {
            M::Event(pb::Event {
                id: id.into(),
                ..Default::default()
            })
        };
        let M::Batch(batch) = bundle(vec![event("x"), event("y")]) else {
            panic!("several events make a batch");
        };
        let ids: Vec<&str> = batch.events.iter().map(|e| e.id.as_str()).collect();
        assert_eq!(
            ids,
            ["x", "y"],
            "MODE_EVENTS work goes in the batch's events"
        );
        assert!(batch.requests.is_empty());
    }

    #[test]
    fn the_applied_batch_size_is_what_was_asked_within_the_limit() {
        use super::super::connect::{MAX_BATCH, batch_size};
        assert_eq!(batch_size(0), 1, "0 means no batches");
        assert_eq!(batch_size(1), 1);
        assert_eq!(batch_size(16), 16);
        assert_eq!(batch_size(u32::MAX), MAX_BATCH as usize);
    }
}
