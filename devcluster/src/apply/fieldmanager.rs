//! Server-side apply field ownership, tracked in `metadata.managedFields`.
//!
//! The wire format follows kube-apiserver exactly (structured-merge-diff
//! "FieldsV1" sets) so that `kubectl` and client libraries can read and
//! round-trip what we store. The merge semantics are a schema-less
//! approximation of structured-merge-diff: maps always merge, lists merge
//! only when the server's [`ListKeyFn`] says how, everything else is atomic.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

/// How a list field is merged; the server supplies this (from its table of
/// built-in merge keys, or `None` for CRDs = atomic).
///
/// The argument is the path of *field names only* from the object root to the
/// list (list item keys are skipped), e.g. `["spec", "template", "spec",
/// "containers", "ports"]`, because merge keys are a property of the schema,
/// not of a particular item. `metadata.finalizers` (set) and
/// `metadata.ownerReferences` (keyed by `uid`) are built in and only consulted
/// when the callback returns `None`.
pub(crate) type ListKeyFn<'a> = &'a dyn Fn(&[&str]) -> Option<ListKey>;

/// Merge strategy of a list, mirroring `x-kubernetes-list-type`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ListKey {
    /// `map` list: items are objects identified by this (scalar) field.
    Key(&'static str),
    /// `map` list with `x-kubernetes-list-map-keys` from a schema: items are identified by
    /// these fields together.
    Keys(Vec<String>),
    /// `set` list: items are scalars identified by their value.
    Set,
}

impl ListKey {
    /// The key fields of a `map` list.
    fn fields(&self) -> Option<Vec<&str>> {
        match self {
            ListKey::Key(k) => Some(vec![k]),
            ListKey::Keys(ks) => Some(ks.iter().map(String::as_str).collect()),
            ListKey::Set => None,
        }
    }
}

/// One field that an apply would take away from another manager.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Conflict {
    /// Name of the manager currently owning the field.
    pub(crate) manager: String,
    /// Path in structured-merge-diff notation, like `.spec.replicas` or
    /// `.spec.containers[name="web"].image`.
    pub(crate) field: String,
}

/// Why an apply was rejected.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ApplyError {
    /// Fields owned by other managers would change; the server answers 409.
    #[error("Apply failed with {} conflict(s)", .0.len())]
    Conflicts(Vec<Conflict>),
    /// The apply configuration is malformed; the server answers 400/422.
    #[error("{0}")]
    Invalid(String),
}

/// Who is writing, and how lists are merged for this resource.
pub(crate) struct Op<'a> {
    /// Field manager name (`?fieldManager=`).
    pub(crate) manager: &'a str,
    /// API version the request was made in; recorded in the entry.
    pub(crate) api_version: &'a str,
    /// Request time in RFC3339; recorded in the entry.
    pub(crate) time: &'a str,
    /// Subresource written (e.g. `status`), which separates ownership entries.
    pub(crate) subresource: Option<&'a str>,
    /// Merge strategy lookup for list fields.
    pub(crate) list_key: ListKeyFn<'a>,
}

/// Metadata fields that are server-controlled or identity, so owning them
/// would only produce spurious conflicts (same list as kube-apiserver strips).
const IGNORED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
];

// ---------------------------------------------------------------------------
// Path elements and field sets
// ---------------------------------------------------------------------------

/// One step of a field path. Ordering matches structured-merge-diff's
/// `PathElement.Compare` so serialized sets list keys in the same order as k8s.
#[derive(Debug, Clone)]
enum Pe {
    Field(String),
    /// Key fields sorted by name, as k8s requires for a canonical `k:` form.
    Key(Vec<(String, Value)>),
    Value(Value),
}

impl Pe {
    fn to_wire(&self) -> String {
        match self {
            Pe::Field(name) => format!("f:{name}"),
            Pe::Key(fields) => {
                let map: Map<String, Value> = fields.iter().cloned().collect();
                format!("k:{}", Value::Object(map))
            }
            Pe::Value(v) => format!("v:{v}"),
        }
    }

    fn parse(s: &str) -> Option<Pe> {
        if let Some(name) = s.strip_prefix("f:") {
            return Some(Pe::Field(name.to_string()));
        }
        if let Some(key) = s.strip_prefix("k:") {
            let Value::Object(map) = serde_json::from_str::<Value>(key).ok()? else {
                return None;
            };
            return Some(key_pe(map.into_iter().collect()));
        }
        if let Some(v) = s.strip_prefix("v:") {
            return serde_json::from_str(v).ok().map(Pe::Value);
        }
        // "i:" (positional) elements only appear for schemas we never
        // produce; rejecting them makes the whole entry be ignored.
        None
    }

    /// Human form used in conflict messages (`.a`, `[k="v"]`, `[="v"]`).
    fn display(&self) -> String {
        match self {
            Pe::Field(name) => format!(".{name}"),
            Pe::Key(fields) => {
                let parts: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                format!("[{}]", parts.join(","))
            }
            Pe::Value(v) => format!("[={v}]"),
        }
    }

    /// Whether a list item is the one this element addresses.
    fn matches(&self, item: &Value) -> bool {
        match self {
            Pe::Field(_) => false,
            Pe::Key(fields) => fields.iter().all(|(k, v)| item.get(k) == Some(v)),
            Pe::Value(v) => item == v,
        }
    }
}

fn key_pe(mut fields: Vec<(String, Value)>) -> Pe {
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    Pe::Key(fields)
}

impl Ord for Pe {
    fn cmp(&self, other: &Self) -> Ordering {
        match (self, other) {
            (Pe::Field(a), Pe::Field(b)) => a.cmp(b),
            (Pe::Field(_), _) => Ordering::Less,
            (_, Pe::Field(_)) => Ordering::Greater,
            (Pe::Key(a), Pe::Key(b)) => {
                for ((an, av), (bn, bv)) in a.iter().zip(b) {
                    let o = an.cmp(bn).then_with(|| cmp_value(av, bv));
                    if o != Ordering::Equal {
                        return o;
                    }
                }
                a.len().cmp(&b.len())
            }
            (Pe::Key(_), _) => Ordering::Less,
            (_, Pe::Key(_)) => Ordering::Greater,
            (Pe::Value(a), Pe::Value(b)) => cmp_value(a, b),
        }
    }
}

impl PartialOrd for Pe {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Pe {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Pe {}

/// Total order over JSON values following structured-merge-diff's
/// `value.Compare` (numbers < strings < bools < lists < maps < null), so that
/// `k:`/`v:` entries sort numerically where k8s does.
fn cmp_value(a: &Value, b: &Value) -> Ordering {
    fn rank(v: &Value) -> u8 {
        match v {
            Value::Number(_) => 0,
            Value::String(_) => 1,
            Value::Bool(_) => 2,
            Value::Array(_) => 3,
            Value::Object(_) => 4,
            Value::Null => 5,
        }
    }
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if let (Some(x), Some(y)) = (x.as_i64(), y.as_i64()) {
                x.cmp(&y)
            } else if let (Some(x), Some(y)) = (x.as_u64(), y.as_u64()) {
                x.cmp(&y)
            } else {
                let (x, y) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
                x.partial_cmp(&y).unwrap_or(Ordering::Equal)
            }
        }
        (Value::String(x), Value::String(y)) => x.cmp(y),
        (Value::Bool(x), Value::Bool(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => {
            for (xv, yv) in x.iter().zip(y) {
                let o = cmp_value(xv, yv);
                if o != Ordering::Equal {
                    return o;
                }
            }
            x.len().cmp(&y.len())
        }
        (Value::Object(_), Value::Object(_)) => a.to_string().cmp(&b.to_string()),
        _ => rank(a).cmp(&rank(b)),
    }
}

type Path = Vec<Pe>;

fn path_string(path: &[Pe]) -> String {
    path.iter().map(Pe::display).collect()
}

/// A structured-merge-diff field set as a trie. `member` marks that the path
/// itself is owned (a leaf, or a list item's `"."`); a node may be both a
/// member and have children.
#[derive(Debug, Clone, Default, PartialEq)]
struct Node {
    member: bool,
    children: BTreeMap<Pe, Node>,
}

impl Node {
    fn insert(&mut self, path: &[Pe]) {
        let mut node = self;
        for pe in path {
            node = node.children.entry(pe.clone()).or_default();
        }
        node.member = true;
    }

    fn get(&self, path: &[Pe]) -> Option<&Node> {
        let mut node = self;
        for pe in path {
            node = node.children.get(pe)?;
        }
        Some(node)
    }

    fn contains(&self, path: &[Pe]) -> bool {
        self.get(path).is_some_and(|n| n.member)
    }

    fn has_member(&self) -> bool {
        self.member || self.children.values().any(Node::has_member)
    }

    /// True if `path` or anything beneath it is owned; removing an object
    /// node would destroy those descendants too.
    fn owns_at_or_below(&self, path: &[Pe]) -> bool {
        self.get(path).is_some_and(Node::has_member)
    }

    /// Unmarks `path`, pruning nodes left with nothing so that emptiness
    /// checks and serialization never see dangling branches.
    fn remove(&mut self, path: &[Pe]) {
        match path.split_first() {
            None => self.member = false,
            Some((pe, rest)) => {
                if let Some(child) = self.children.get_mut(pe) {
                    child.remove(rest);
                    if !child.member && child.children.is_empty() {
                        self.children.remove(pe);
                    }
                }
            }
        }
    }

    fn union(&mut self, other: &Node) {
        self.member |= other.member;
        for (pe, child) in &other.children {
            self.children.entry(pe.clone()).or_default().union(child);
        }
    }

    fn is_empty(&self) -> bool {
        !self.has_member()
    }

    fn members(&self) -> Vec<Path> {
        fn walk(node: &Node, prefix: &mut Path, out: &mut Vec<Path>) {
            if node.member && !prefix.is_empty() {
                out.push(prefix.clone());
            }
            for (pe, child) in &node.children {
                prefix.push(pe.clone());
                walk(child, prefix, out);
                prefix.pop();
            }
        }
        let mut out = Vec::new();
        walk(self, &mut Vec::new(), &mut out);
        out
    }

    fn to_json(&self) -> Value {
        let mut map = Map::new();
        if self.member && !self.children.is_empty() {
            map.insert(".".to_string(), Value::Object(Map::new()));
        }
        for (pe, child) in &self.children {
            if child.has_member() {
                map.insert(pe.to_wire(), child.to_json());
            }
        }
        Value::Object(map)
    }

    fn from_json(v: &Value) -> Option<Node> {
        let mut node = Node::default();
        for (k, child) in v.as_object()? {
            if k == "." {
                node.member = true;
                continue;
            }
            let pe = Pe::parse(k)?;
            let mut child = Node::from_json(child)?;
            if child.children.is_empty() {
                // `{}` is how a leaf is spelled on the wire.
                child.member = true;
            }
            node.children.insert(pe, child);
        }
        Some(node)
    }
}

// ---------------------------------------------------------------------------
// Walking objects
// ---------------------------------------------------------------------------

fn list_kind(lk: ListKeyFn, names: &[&str]) -> Option<ListKey> {
    lk(names).or(match names {
        ["metadata", "finalizers"] => Some(ListKey::Set),
        ["metadata", "ownerReferences"] => Some(ListKey::Key("uid")),
        _ => None,
    })
}

/// Identifies every item of an associative list, or explains why the list
/// cannot be treated as one (missing or duplicate keys).
fn keyed_items(items: &[Value], keys: &[&str]) -> Result<Vec<Pe>, String> {
    let mut out: Vec<Pe> = Vec::with_capacity(items.len());
    for item in items {
        let mut fields = Vec::with_capacity(keys.len());
        for key in keys {
            let k = item
                .as_object()
                .and_then(|o| o.get(*key))
                .filter(|v| !v.is_object() && !v.is_array())
                .ok_or_else(|| {
                    format!(
                        "associative list with key {key:?} has an element that omits the key field"
                    )
                })?;
            fields.push((key.to_string(), k.clone()));
        }
        let shown: Vec<String> = fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let pe = key_pe(fields);
        if out.contains(&pe) {
            return Err(format!("duplicate entries for key [{}]", shown.join(",")));
        }
        out.push(pe);
    }
    Ok(out)
}

fn set_items(items: &[Value]) -> Result<Vec<Pe>, String> {
    let mut out: Vec<Pe> = Vec::with_capacity(items.len());
    for item in items {
        if item.is_object() || item.is_array() {
            return Err("set list may only contain scalar values".to_string());
        }
        let pe = Pe::Value(item.clone());
        if out.contains(&pe) {
            return Err(format!("duplicate entries for set value {item}"));
        }
        out.push(pe);
    }
    Ok(out)
}

struct Walker<'a> {
    list_key: ListKeyFn<'a>,
    /// Apply configurations must be well-formed; stored objects are taken
    /// as they are, degrading malformed lists to atomic leaves.
    strict: bool,
}

impl Walker<'_> {
    fn field_set(&self, v: &Value) -> Result<Node, ApplyError> {
        let mut out = Node::default();
        self.collect(v, &mut Vec::new(), &mut Vec::new(), &mut out)?;
        Ok(out)
    }

    fn collect<'v>(
        &self,
        v: &'v Value,
        path: &mut Path,
        names: &mut Vec<&'v str>,
        out: &mut Node,
    ) -> Result<(), ApplyError> {
        match v {
            Value::Object(map) => {
                let at_root = path.is_empty();
                let at_meta = path.len() == 1 && names.first() == Some(&"metadata");
                // Empty maps are leaves so that `{}` can be owned; the root and
                // metadata are containers whose emptiness means nothing.
                if map.is_empty() && !at_root && !at_meta {
                    out.insert(path);
                    return Ok(());
                }
                for (k, child) in map {
                    if at_root && (k == "apiVersion" || k == "kind") {
                        continue;
                    }
                    if at_meta && IGNORED_METADATA.contains(&k.as_str()) {
                        continue;
                    }
                    path.push(Pe::Field(k.clone()));
                    names.push(k);
                    let r = self.collect(child, path, names, out);
                    names.pop();
                    path.pop();
                    r?;
                }
            }
            Value::Array(items) if !items.is_empty() => {
                let kind = list_kind(self.list_key, names);
                let keyed = kind.as_ref().and_then(ListKey::fields);
                let pes = match (&kind, &keyed) {
                    (_, Some(keys)) => keyed_items(items, keys).map(Some),
                    (Some(ListKey::Set), _) => set_items(items).map(Some),
                    _ => Ok(None),
                };
                match pes {
                    Ok(Some(pes)) => {
                        for (pe, item) in pes.into_iter().zip(items) {
                            path.push(pe);
                            out.insert(path);
                            if keyed.is_some() {
                                self.collect(item, path, names, out)?;
                            }
                            path.pop();
                        }
                    }
                    Ok(None) => out.insert(path),
                    Err(msg) if self.strict => {
                        return Err(ApplyError::Invalid(format!("{}: {msg}", path_string(path))));
                    }
                    Err(_) => out.insert(path),
                }
            }
            _ => out.insert(path),
        }
        Ok(())
    }

    /// Merges the apply configuration into the live object the way
    /// structured-merge-diff would with the same list semantics. Live order is
    /// kept and new list items are appended, so re-applies don't reshuffle.
    fn merge<'v>(&self, live: &'v Value, applied: &'v Value, names: &mut Vec<&'v str>) -> Value {
        match (live, applied) {
            (Value::Object(l), Value::Object(a)) => {
                let mut out = l.clone();
                for (k, av) in a {
                    let merged = match l.get(k) {
                        Some(lv) => {
                            names.push(k);
                            let m = self.merge(lv, av, names);
                            names.pop();
                            m
                        }
                        None => av.clone(),
                    };
                    out.insert(k.clone(), merged);
                }
                Value::Object(out)
            }
            (Value::Array(l), Value::Array(a)) => match list_kind(self.list_key, names) {
                Some(lk @ (ListKey::Key(_) | ListKey::Keys(_))) => {
                    let keys = lk.fields().unwrap_or_default();
                    self.merge_keyed(l, a, &keys, names, applied)
                }
                Some(ListKey::Set) => {
                    let mut out = l.clone();
                    for v in a {
                        if !out.contains(v) {
                            out.push(v.clone());
                        }
                    }
                    Value::Array(out)
                }
                None => applied.clone(),
            },
            _ => applied.clone(),
        }
    }
}

impl Walker<'_> {
    /// Merges a `map` list item by item, by key; malformed lists are replaced whole.
    fn merge_keyed<'v>(
        &self,
        l: &'v [Value],
        a: &'v [Value],
        keys: &[&str],
        names: &mut Vec<&'v str>,
        applied: &Value,
    ) -> Value {
        let (Ok(lkeys), Ok(akeys)) = (keyed_items(l, keys), keyed_items(a, keys)) else {
            return applied.clone();
        };
        let mut out = l.to_vec();
        for (a_pe, aitem) in akeys.iter().zip(a) {
            match lkeys.iter().position(|p| p == a_pe) {
                Some(pos) => out[pos] = self.merge(&l[pos], aitem, names),
                None => out.push(aitem.clone()),
            }
        }
        Value::Array(out)
    }
}

fn get_path<'v>(v: &'v Value, path: &[Pe]) -> Option<&'v Value> {
    let mut cur = v;
    for pe in path {
        cur = match pe {
            Pe::Field(name) => cur.as_object()?.get(name)?,
            _ => cur.as_array()?.iter().find(|item| pe.matches(item))?,
        };
    }
    Some(cur)
}

fn get_path_mut<'v>(v: &'v mut Value, path: &[Pe]) -> Option<&'v mut Value> {
    let mut cur = v;
    for pe in path {
        cur = match pe {
            Pe::Field(name) => cur.as_object_mut()?.get_mut(name)?,
            _ => cur
                .as_array_mut()?
                .iter_mut()
                .find(|item| pe.matches(item))?,
        };
    }
    Some(cur)
}

fn remove_path(v: &mut Value, path: &[Pe]) {
    let Some((last, parent)) = path.split_last() else {
        return;
    };
    let Some(container) = get_path_mut(v, parent) else {
        return;
    };
    match last {
        Pe::Field(name) => {
            if let Some(map) = container.as_object_mut() {
                // shift_remove keeps the remaining fields in their order.
                map.shift_remove(name);
            }
        }
        _ => {
            if let Some(items) = container.as_array_mut() {
                items.retain(|item| !last.matches(item));
            }
        }
    }
}

/// A key field of a list item can't be pruned on its own: the item would lose
/// its identity. It goes away only together with the item.
fn is_item_key_field(path: &[Pe]) -> bool {
    match path {
        [.., Pe::Key(fields), Pe::Field(name)] => fields.iter().any(|(k, _)| k == name),
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// managedFields entries
// ---------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct Entry {
    manager: String,
    apply: bool,
    api_version: String,
    time: Option<String>,
    subresource: Option<String>,
    set: Node,
}

impl Entry {
    fn parse(v: &Value) -> Option<Entry> {
        let o = v.as_object()?;
        let manager = o.get("manager")?.as_str()?.to_string();
        let apply = match o.get("operation")?.as_str()? {
            "Apply" => true,
            "Update" => false,
            _ => return None,
        };
        match o.get("fieldsType") {
            None | Some(Value::Null) => {}
            Some(t) if t == "FieldsV1" => {}
            Some(_) => return None,
        }
        let mut set = match o.get("fieldsV1") {
            None | Some(Value::Null) => Node::default(),
            Some(f) => Node::from_json(f)?,
        };
        set.member = false;
        Some(Entry {
            manager,
            apply,
            api_version: str_field(o, "apiVersion").unwrap_or_default(),
            time: str_field(o, "time"),
            subresource: str_field(o, "subresource").filter(|s| !s.is_empty()),
            set,
        })
    }

    fn to_json(&self) -> Value {
        // Key order matches metav1.ManagedFieldsEntry's JSON encoding.
        let mut m = Map::new();
        m.insert("manager".into(), json!(self.manager));
        m.insert(
            "operation".into(),
            json!(if self.apply { "Apply" } else { "Update" }),
        );
        m.insert("apiVersion".into(), json!(self.api_version));
        if let Some(t) = &self.time {
            m.insert("time".into(), json!(t));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), self.set.to_json());
        if let Some(s) = &self.subresource {
            m.insert("subresource".into(), json!(s));
        }
        Value::Object(m)
    }

    /// Apply entries are identified by manager+subresource, Update entries
    /// additionally by apiVersion (k8s `BuildManagerIdentifier`).
    fn is_apply_of(&self, op: &Op) -> bool {
        self.apply && self.manager == op.manager && self.subresource.as_deref() == op.subresource
    }

    fn is_update_of(&self, op: &Op) -> bool {
        !self.apply
            && self.manager == op.manager
            && self.api_version == op.api_version
            && self.subresource.as_deref() == op.subresource
    }

    fn new_for(op: &Op, apply: bool, set: Node) -> Entry {
        Entry {
            manager: op.manager.to_string(),
            apply,
            api_version: op.api_version.to_string(),
            time: Some(op.time.to_string()),
            subresource: op.subresource.map(str::to_string),
            set,
        }
    }
}

fn str_field(o: &Map<String, Value>, k: &str) -> Option<String> {
    o.get(k).and_then(Value::as_str).map(str::to_string)
}

fn parse_entries(mf: Option<&Value>) -> Vec<Entry> {
    mf.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Entry::parse).collect())
        .unwrap_or_default()
}

/// Drops empty entries, sorts like kube-apiserver (operation, time, manager,
/// apiVersion, subresource) and stores them on the object.
fn write_entries(obj: &mut Value, mut entries: Vec<Entry>) {
    entries.retain(|e| !e.set.is_empty());
    entries.sort_by(|p, q| {
        p.apply
            .cmp(&q.apply)
            .reverse()
            .then_with(|| p.time.cmp(&q.time))
            .then_with(|| p.manager.cmp(&q.manager))
            .then_with(|| p.api_version.cmp(&q.api_version))
            .then_with(|| p.subresource.cmp(&q.subresource))
    });
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    if entries.is_empty() {
        if let Some(Value::Object(meta)) = root.get_mut("metadata") {
            meta.shift_remove("managedFields");
        }
        return;
    }
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(meta) = meta {
        let list = entries.iter().map(Entry::to_json).collect();
        meta.insert("managedFields".into(), Value::Array(list));
    }
}

// ---------------------------------------------------------------------------
// Public operations
// ---------------------------------------------------------------------------

/// Server-side apply `applied` (the user's partial intent) onto `live`
/// (`None` = create-on-apply), returning the merged object with updated
/// `metadata.managedFields`.
///
/// A field in `applied` owned by another manager (Apply or Update entries)
/// whose live value differs from the applied value is a conflict, reported as
/// [`ApplyError::Conflicts`] unless `force`, in which case ownership moves to
/// this manager. Values equal to the live value become shared. Fields this
/// manager applied last time but no longer applies are removed from the
/// object unless another entry still owns them. Maps merge; lists merge by
/// [`ListKey`] (keyed items are owned as `k:{..}` plus their fields, set
/// values as `v:`); other lists are atomic leaves.
pub(crate) fn apply(
    live: Option<&Value>,
    applied: &Value,
    force: bool,
    op: &Op,
) -> Result<Value, ApplyError> {
    let empty = Value::Object(Map::new());
    let live = live.unwrap_or(&empty);
    check_apply_input(live, applied)?;

    let strict = Walker {
        list_key: op.list_key,
        strict: true,
    };
    let lenient = Walker {
        list_key: op.list_key,
        strict: false,
    };
    let applied_set = strict.field_set(applied)?;
    let mut merged = lenient.merge(live, applied, &mut Vec::new());
    if let Some(Value::Object(meta)) = merged.get_mut("metadata") {
        // Rebuilt below from the parsed entries.
        meta.shift_remove("managedFields");
    }

    let mut entries = parse_entries(live.pointer("/metadata/managedFields"));
    let own = entries.iter().position(|e| e.is_apply_of(op));
    let previous = own.map(|i| entries[i].set.clone()).unwrap_or_default();

    let (mut conflicts, taken) = conflicts(&entries, &applied_set, live, &merged, op);
    if !conflicts.is_empty() && !force && !upgrades_client_side_apply(live, &taken, op, &lenient) {
        conflicts.sort_by(|a, b| a.manager.cmp(&b.manager));
        return Err(ApplyError::Conflicts(conflicts));
    }
    for (i, path) in &taken {
        entries[*i].set.remove(path);
    }

    prune_dropped(&mut merged, &entries, own, &previous, &applied_set);

    match own {
        Some(i) => {
            let e = &mut entries[i];
            e.set = applied_set;
            e.api_version = op.api_version.to_string();
            e.time = Some(op.time.to_string());
        }
        None => entries.push(Entry::new_for(op, true, applied_set)),
    }
    write_entries(&mut merged, entries);
    Ok(merged)
}

/// The apply configuration and the live object are JSON objects, and the configuration sets no
/// `managedFields`.
fn check_apply_input(live: &Value, applied: &Value) -> Result<(), ApplyError> {
    if !applied.is_object() {
        return Err(ApplyError::Invalid(
            "apply configuration must be a JSON object".to_string(),
        ));
    }
    if applied
        .pointer("/metadata/managedFields")
        .is_some_and(|v| !v.is_null())
    {
        return Err(ApplyError::Invalid(
            "metadata.managedFields must be nil".to_string(),
        ));
    }
    if !live.is_object() {
        return Err(ApplyError::Invalid(
            "live object is not a JSON object".to_string(),
        ));
    }
    Ok(())
}

/// The fields this apply would take from other managers (a value it changes, or a keyed item it
/// adds), once per manager and field, and each as (entry index, path) to take if allowed.
fn conflicts(
    entries: &[Entry],
    applied_set: &Node,
    live: &Value,
    merged: &Value,
    op: &Op,
) -> (Vec<Conflict>, Vec<(usize, Path)>) {
    let mut conflicts: Vec<Conflict> = Vec::new();
    let mut taken: Vec<(usize, Path)> = Vec::new();
    for (i, entry) in entries.iter().enumerate() {
        // A manager never conflicts with itself, even across its own
        // Update/Apply entries; that would only confuse users.
        if entry.manager == op.manager {
            continue;
        }
        for path in entry.set.members() {
            let Some(node) = applied_set.get(&path).filter(|n| n.member) else {
                continue;
            };
            let before = get_path(live, &path);
            // A keyed item "changes" only by appearing; its fields are
            // compared individually.
            let changed = if node.children.is_empty() {
                before != get_path(merged, &path)
            } else {
                before.is_none()
            };
            if changed {
                let field = path_string(&path);
                if !conflicts
                    .iter()
                    .any(|c| c.manager == entry.manager && c.field == field)
                {
                    conflicts.push(Conflict {
                        manager: entry.manager.clone(),
                        field,
                    });
                }
                taken.push((i, path));
            }
        }
    }
    (conflicts, taken)
}

/// Removes what this manager applied last time and no longer applies, unless another entry
/// still owns it; deepest first, so that an item's fields go before the item.
fn prune_dropped(
    merged: &mut Value,
    entries: &[Entry],
    own: Option<usize>,
    previous: &Node,
    applied_set: &Node,
) {
    let mut dropped: Vec<Path> = previous
        .members()
        .into_iter()
        .filter(|p| !applied_set.owns_at_or_below(p))
        .collect();
    dropped.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for path in dropped {
        if is_item_key_field(&path) {
            continue;
        }
        let owned_elsewhere = entries
            .iter()
            .enumerate()
            .any(|(i, e)| Some(i) != own && e.set.owns_at_or_below(&path));
        if !owned_elsewhere {
            remove_path(merged, &path);
        }
    }
}

/// The manager `kubectl apply --server-side` uses unless told otherwise.
const KUBECTL_MANAGER: &str = "kubectl";
/// Where client-side apply keeps what it last applied.
const LAST_APPLIED: &str =
    "/metadata/annotations/kubectl.kubernetes.io~1last-applied-configuration";

/// kube-apiserver's `lastAppliedManager`: when kubectl upgrades an object from client-side to
/// server-side apply (manager `kubectl`), it may take over without `--force-conflicts` every
/// conflicting field it had last applied client-side, i.e. fields in the
/// last-applied-configuration annotation whose live value is still the one it applied. A field
/// someone else changed since still conflicts.
fn upgrades_client_side_apply(
    live: &Value,
    taken: &[(usize, Path)],
    op: &Op,
    walker: &Walker,
) -> bool {
    if op.manager != KUBECTL_MANAGER {
        return false;
    }
    let Some(last) = live
        .pointer(LAST_APPLIED)
        .and_then(Value::as_str)
        .and_then(|s| serde_json::from_str::<Value>(s).ok())
    else {
        return false;
    };
    let Ok(last_set) = walker.field_set(&last) else {
        return false;
    };
    taken.iter().all(|(_, path)| {
        last_set.get(path).is_some_and(|n| n.member)
            && get_path(&last, path) == get_path(live, path)
    })
}

/// Records a non-apply write (create/update/patch) in
/// `new.metadata.managedFields`.
///
/// Fields whose value differs between `old` (`None` for create: every field
/// of `new`) and `new` become owned by `op.manager` in its Update entry for
/// the same apiVersion/subresource and are taken from every other entry;
/// ownership of fields that no longer exist is dropped, as are entries left
/// empty. The starting entries come from `old`, unless the client sent a
/// different non-empty `managedFields` in `new`, which k8s honours as an
/// explicit override (an empty list never wipes ownership).
pub(crate) fn record_update(old: Option<&Value>, new: &mut Value, op: &Op) {
    if !new.is_object() {
        return;
    }
    let old_mf = old.and_then(|o| o.pointer("/metadata/managedFields"));
    let new_mf = new.pointer("/metadata/managedFields");
    let client_override =
        new_mf.is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty())) && new_mf != old_mf;
    let mut entries = parse_entries(if client_override { new_mf } else { old_mf });

    let walker = Walker {
        list_key: op.list_key,
        strict: false,
    };
    // Lenient walking cannot fail; an error would only mean "own nothing".
    let new_set = walker.field_set(new).unwrap_or_default();
    let mut changed = Node::default();
    for path in new_set.members() {
        let before = old.and_then(|o| get_path(o, &path));
        let is_item = new_set.get(&path).is_some_and(|n| !n.children.is_empty());
        let differs = if is_item {
            before.is_none()
        } else {
            before != get_path(new, &path)
        };
        if differs {
            changed.insert(&path);
        }
    }

    for entry in &mut entries {
        let mine = entry.is_update_of(op);
        for path in entry.set.members() {
            let gone = get_path(new, &path).is_none();
            if gone || (!mine && changed.contains(&path)) {
                entry.set.remove(&path);
            }
        }
    }
    if !changed.is_empty() {
        match entries.iter_mut().find(|e| e.is_update_of(op)) {
            Some(e) => {
                e.set.union(&changed);
                e.time = Some(op.time.to_string());
            }
            None => entries.push(Entry::new_for(op, false, changed)),
        }
    }
    write_entries(new, entries);
}

/// Renders conflicts the way kube-apiserver does for a 409 `Status`: the
/// message (`Apply failed with 1 conflict: conflict with "mgr": .spec.replicas`,
/// or grouped by manager for several) and the `details.causes` list.
pub(crate) fn conflict_status_parts(conflicts: &[Conflict]) -> (String, Vec<Value>) {
    // Go's %q and JSON agree for the manager names that occur in practice.
    let quote = |s: &str| Value::String(s.to_string()).to_string();
    let causes = conflicts
        .iter()
        .map(|c| {
            json!({
                "type": "FieldManagerConflict",
                "message": format!("conflict with {}", quote(&c.manager)),
                "field": c.field,
            })
        })
        .collect();
    let message = if let [c] = conflicts {
        format!(
            "Apply failed with 1 conflict: conflict with {}: {}",
            quote(&c.manager),
            c.field
        )
    } else {
        let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for c in conflicts {
            by_manager.entry(&c.manager).or_default().push(&c.field);
        }
        let mut lines = Vec::new();
        for (manager, fields) in by_manager {
            lines.push(format!("conflicts with {}:", quote(manager)));
            lines.extend(fields.into_iter().map(|f| format!("- {f}")));
        }
        format!(
            "Apply failed with {} conflicts: {}",
            conflicts.len(),
            lines.join("\n")
        )
    };
    (message, causes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lk(path: &[&str]) -> Option<ListKey> {
        match path {
            ["spec", "containers"] | ["spec", "template", "spec", "containers"] => {
                Some(ListKey::Key("name"))
            }
            _ => None,
        }
    }

    fn op<'a>(manager: &'a str, time: &'a str) -> Op<'a> {
        Op {
            manager,
            api_version: "apps/v1",
            time,
            subresource: None,
            list_key: &lk,
        }
    }

    fn managed(obj: &Value) -> Vec<Value> {
        obj.pointer("/metadata/managedFields")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    }

    fn fields_of(obj: &Value, manager: &str, operation: &str) -> Option<Value> {
        managed(obj)
            .into_iter()
            .find(|e| e["manager"] == manager && e["operation"] == operation)
            .map(|e| e["fieldsV1"].clone())
    }

    fn deploy(spec: Value) -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
               "metadata": {"name": "d", "namespace": "default"}, "spec": spec})
    }

    /// A config that owns nothing: `spec: {}` would itself be an owned leaf.
    fn bare() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}})
    }

    fn conflicts(r: Result<Value, ApplyError>) -> Vec<Conflict> {
        match r {
            Err(ApplyError::Conflicts(c)) => c,
            other => panic!("expected conflicts, got {other:?}"),
        }
    }

    #[test]
    fn create_on_apply_owns_all_applied_fields() {
        let applied = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "default", "labels": {"app": "web"}},
            "spec": {"replicas": 3, "template": {"spec": {"containers": [
                {"name": "web", "image": "nginx"}]}}}
        });
        let out = apply(None, &applied, false, &op("alice", "2024-01-01T00:00:00Z"))
            .expect("apply succeeds");
        assert_eq!(
            managed(&out),
            vec![json!({
                "manager": "alice", "operation": "Apply", "apiVersion": "apps/v1",
                "time": "2024-01-01T00:00:00Z", "fieldsType": "FieldsV1",
                "fieldsV1": {
                    "f:metadata": {"f:labels": {"f:app": {}}},
                    "f:spec": {"f:replicas": {}, "f:template": {"f:spec": {"f:containers": {
                        "k:{\"name\":\"web\"}": {".": {}, "f:image": {}, "f:name": {}}}}}}
                }
            })]
        );
        assert_eq!(out["spec"]["replicas"], 3);
        assert_eq!(out["metadata"]["name"], "d");
    }

    #[test]
    fn fields_v1_serialization_matches_k8s_byte_for_byte() {
        let applied = json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "labels": {"app": "x"}},
            "spec": {"containers": [{"name": "web", "image": "nginx"}]}});
        let out = apply(None, &applied, false, &op("m", "t")).expect("apply succeeds");
        let fields = fields_of(&out, "m", "Apply").expect("manager entry exists");
        assert_eq!(
            serde_json::to_string(&fields).expect("serializes"),
            r#"{"f:metadata":{"f:labels":{"f:app":{}}},"f:spec":{"f:containers":{"k:{\"name\":\"web\"}":{".":{},"f:image":{},"f:name":{}}}}}"#
        );
    }

    #[test]
    fn two_managers_applying_different_fields_coexist() {
        let a = apply(None, &deploy(json!({"replicas": 3})), false, &op("a", "t1"))
            .expect("apply succeeds");
        let b_cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "labels": {"team": "x"}}});
        let b = apply(Some(&a), &b_cfg, false, &op("b", "t2")).expect("apply succeeds");
        assert_eq!(b["spec"]["replicas"], 3);
        assert_eq!(b["metadata"]["labels"]["team"], "x");
        assert_eq!(
            fields_of(&b, "a", "Apply").expect("manager entry exists"),
            json!({"f:spec": {"f:replicas": {}}})
        );
        assert_eq!(
            fields_of(&b, "b", "Apply").expect("manager entry exists"),
            json!({"f:metadata": {"f:labels": {"f:team": {}}}})
        );
        // Re-applying a's config again must not remove b's label.
        let again = apply(
            Some(&b),
            &deploy(json!({"replicas": 3})),
            false,
            &op("a", "t3"),
        )
        .expect("apply succeeds");
        assert_eq!(again["metadata"]["labels"]["team"], "x");
    }

    #[test]
    fn differing_value_conflicts_without_force_and_transfers_with_force() {
        let a = apply(
            None,
            &deploy(json!({"replicas": 3, "paused": false})),
            false,
            &op("a", "t1"),
        )
        .expect("apply succeeds");
        let b_cfg = deploy(json!({"replicas": 5}));
        let c = conflicts(apply(Some(&a), &b_cfg, false, &op("b", "t2")));
        assert_eq!(
            c,
            vec![Conflict {
                manager: "a".into(),
                field: ".spec.replicas".into()
            }]
        );
        let forced = apply(Some(&a), &b_cfg, true, &op("b", "t2")).expect("apply succeeds");
        assert_eq!(forced["spec"]["replicas"], 5);
        assert_eq!(
            fields_of(&forced, "a", "Apply").expect("manager entry exists"),
            json!({"f:spec": {"f:paused": {}}})
        );
        assert_eq!(
            fields_of(&forced, "b", "Apply").expect("manager entry exists"),
            json!({"f:spec": {"f:replicas": {}}})
        );
        // a no longer owns replicas, so dropping paused only leaves a's entry empty.
        let a2 = apply(Some(&forced), &bare(), false, &op("a", "t3")).expect("apply succeeds");
        assert!(fields_of(&a2, "a", "Apply").is_none());
        assert_eq!(a2["spec"], json!({"replicas": 5}));
    }

    #[test]
    fn dropping_a_field_removes_it() {
        let a = apply(
            None,
            &deploy(json!({"replicas": 3, "paused": true})),
            false,
            &op("a", "t1"),
        )
        .expect("apply succeeds");
        let out = apply(
            Some(&a),
            &deploy(json!({"replicas": 3})),
            false,
            &op("a", "t2"),
        )
        .expect("apply succeeds");
        assert_eq!(out["spec"], json!({"replicas": 3}));
        assert_eq!(
            fields_of(&out, "a", "Apply").expect("manager entry exists"),
            json!({"f:spec": {"f:replicas": {}}})
        );
    }

    #[test]
    fn shared_field_survives_until_last_owner_drops_it() {
        let a = apply(None, &deploy(json!({"replicas": 3})), false, &op("a", "t1"))
            .expect("apply succeeds");
        let b = apply(
            Some(&a),
            &deploy(json!({"replicas": 3})),
            false,
            &op("b", "t2"),
        )
        .expect("apply succeeds");
        assert_eq!(fields_of(&b, "a", "Apply"), fields_of(&b, "b", "Apply"));
        let a_drop = apply(Some(&b), &bare(), false, &op("a", "t3")).expect("apply succeeds");
        assert_eq!(a_drop["spec"]["replicas"], 3);
        assert!(fields_of(&a_drop, "a", "Apply").is_none());
        let b_drop = apply(Some(&a_drop), &bare(), false, &op("b", "t4")).expect("apply succeeds");
        assert!(b_drop["spec"].get("replicas").is_none());
        assert!(b_drop["metadata"].get("managedFields").is_none());
    }

    #[test]
    fn update_by_other_manager_then_reapply_conflicts() {
        let a = apply(None, &deploy(json!({"replicas": 3})), false, &op("a", "t1"))
            .expect("apply succeeds");
        let mut scaled = a.clone();
        scaled["spec"]["replicas"] = json!(5);
        record_update(Some(&a), &mut scaled, &op("kubectl-scale", "t2"));
        assert!(fields_of(&scaled, "a", "Apply").is_none());
        assert_eq!(
            fields_of(&scaled, "kubectl-scale", "Update").expect("manager entry exists"),
            json!({"f:spec": {"f:replicas": {}}})
        );
        let c = conflicts(apply(
            Some(&scaled),
            &deploy(json!({"replicas": 3})),
            false,
            &op("a", "t3"),
        ));
        assert_eq!(
            c,
            vec![Conflict {
                manager: "kubectl-scale".into(),
                field: ".spec.replicas".into()
            }]
        );
        // Applying the value the updater set is not a conflict: it becomes shared.
        let shared = apply(
            Some(&scaled),
            &deploy(json!({"replicas": 5})),
            false,
            &op("a", "t3"),
        )
        .expect("apply succeeds");
        assert!(fields_of(&shared, "kubectl-scale", "Update").is_some());
        assert!(fields_of(&shared, "a", "Apply").is_some());
    }

    #[test]
    fn keyed_list_items_merge_by_key() {
        let a_cfg = deploy(json!({"template": {"spec": {"containers": [
            {"name": "web", "image": "nginx"}]}}}));
        let a = apply(None, &a_cfg, false, &op("a", "t1")).expect("apply succeeds");
        let b_cfg = deploy(json!({"template": {"spec": {"containers": [
            {"name": "sidecar", "image": "envoy"}]}}}));
        let b = apply(Some(&a), &b_cfg, false, &op("b", "t2")).expect("apply succeeds");
        assert_eq!(
            b["spec"]["template"]["spec"]["containers"],
            json!([{"name": "web", "image": "nginx"}, {"name": "sidecar", "image": "envoy"}])
        );
        // b changing a's container image conflicts on exactly that field.
        let b_bad = deploy(json!({"template": {"spec": {"containers": [
            {"name": "web", "image": "httpd"}]}}}));
        let c = conflicts(apply(Some(&b), &b_bad, false, &op("b", "t3")));
        assert_eq!(
            c,
            vec![Conflict {
                manager: "a".into(),
                field: ".spec.template.spec.containers[name=\"web\"].image".into()
            }]
        );
        // a dropping its container removes only that item.
        let a_drop = apply(
            Some(&b),
            &deploy(json!({"template": {"spec": {"containers": []}}})),
            false,
            &op("a", "t4"),
        );
        let a_drop = a_drop.expect("apply succeeds");
        assert_eq!(
            a_drop["spec"]["template"]["spec"]["containers"],
            json!([{"name": "sidecar", "image": "envoy"}])
        );
    }

    #[test]
    fn item_kept_when_another_manager_owns_one_of_its_fields() {
        let a_cfg = deploy(json!({"template": {"spec": {"containers": [
            {"name": "web", "image": "nginx", "tty": true}]}}}));
        let a = apply(None, &a_cfg, false, &op("a", "t1")).expect("apply succeeds");
        let b_cfg = deploy(json!({"template": {"spec": {"containers": [
            {"name": "web", "image": "nginx"}]}}}));
        let b = apply(Some(&a), &b_cfg, false, &op("b", "t2")).expect("apply succeeds");
        let out = apply(Some(&b), &bare(), false, &op("a", "t3")).expect("apply succeeds");
        assert_eq!(
            out["spec"]["template"]["spec"]["containers"],
            json!([{"name": "web", "image": "nginx"}])
        );
    }

    #[test]
    fn atomic_lists_are_single_leaves() {
        let cfg = deploy(json!({"args": ["a", "b"]}));
        let a = apply(None, &cfg, false, &op("a", "t1")).expect("apply succeeds");
        assert_eq!(
            fields_of(&a, "a", "Apply").expect("manager entry exists"),
            json!({"f:spec": {"f:args": {}}})
        );
        let b = apply(
            Some(&a),
            &deploy(json!({"args": ["c"]})),
            true,
            &op("b", "t2"),
        )
        .expect("apply succeeds");
        assert_eq!(b["spec"]["args"], json!(["c"]));
    }

    #[test]
    fn finalizers_are_a_set() {
        let cfg = |f: &str| {
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "c", "finalizers": [f]}})
        };
        let a = apply(None, &cfg("x/a"), false, &op("a", "t1")).expect("apply succeeds");
        let b = apply(Some(&a), &cfg("x/b"), false, &op("b", "t2")).expect("apply succeeds");
        assert_eq!(b["metadata"]["finalizers"], json!(["x/a", "x/b"]));
        assert_eq!(
            fields_of(&b, "b", "Apply").expect("manager entry exists"),
            json!({"f:metadata": {"f:finalizers": {"v:\"x/b\"": {}}}})
        );
        let a2 = apply(
            Some(&b),
            &json!({"metadata": {"name": "c"}}),
            false,
            &op("a", "t3"),
        )
        .expect("apply succeeds");
        assert_eq!(a2["metadata"]["finalizers"], json!(["x/b"]));
    }

    #[test]
    fn invalid_configurations_are_rejected() {
        let o = op("a", "t");
        assert!(matches!(
            apply(None, &json!([1]), false, &o),
            Err(ApplyError::Invalid(_))
        ));
        let missing_key = deploy(json!({"containers": [{"image": "x"}]}));
        assert!(matches!(
            apply(None, &missing_key, false, &o),
            Err(ApplyError::Invalid(_))
        ));
        let dup = deploy(json!({"containers": [{"name": "x"}, {"name": "x"}]}));
        assert!(matches!(
            apply(None, &dup, false, &o),
            Err(ApplyError::Invalid(_))
        ));
        let with_mf = json!({"metadata": {"managedFields": []}});
        assert!(matches!(
            apply(None, &with_mf, false, &o),
            Err(ApplyError::Invalid(_))
        ));
    }

    #[test]
    fn unparseable_managed_fields_are_ignored() {
        let mut live = deploy(json!({"replicas": 1}));
        live["metadata"]["managedFields"] = json!([
            {"manager": "bad", "operation": "Apply", "fieldsType": "FieldsV1",
             "fieldsV1": {"nonsense": {}}},
            "garbage",
            {"manager": "old", "operation": "Update", "apiVersion": "apps/v1",
             "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}}
        ]);
        let c = conflicts(apply(
            Some(&live),
            &deploy(json!({"replicas": 2})),
            false,
            &op("a", "t"),
        ));
        assert_eq!(
            c,
            vec![Conflict {
                manager: "old".into(),
                field: ".spec.replicas".into()
            }]
        );
        let out = apply(
            Some(&live),
            &deploy(json!({"paused": true})),
            false,
            &op("a", "t"),
        )
        .expect("apply succeeds");
        let managers: Vec<_> = managed(&out).iter().map(|e| e["manager"].clone()).collect();
        assert_eq!(managers, vec![json!("a"), json!("old")]);
    }

    #[test]
    fn ignored_metadata_is_not_owned() {
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "n", "uid": "u", "resourceVersion": "1",
                         "creationTimestamp": "x", "generation": 2,
                         "annotations": {"k": "v"}},
            "data": {"a": "b"}});
        let out = apply(None, &obj, false, &op("a", "t")).expect("apply succeeds");
        assert_eq!(
            fields_of(&out, "a", "Apply").expect("manager entry exists"),
            json!({"f:data": {"f:a": {}}, "f:metadata": {"f:annotations": {"f:k": {}}}})
        );
    }

    #[test]
    fn record_update_owns_changes_and_merges_entries() {
        let mut created = deploy(json!({"replicas": 1, "paused": false}));
        record_update(None, &mut created, &op("ctl", "t1"));
        assert_eq!(
            managed(&created),
            vec![
                json!({"manager": "ctl", "operation": "Update", "apiVersion": "apps/v1",
                "time": "t1", "fieldsType": "FieldsV1",
                "fieldsV1": {"f:spec": {"f:paused": {}, "f:replicas": {}}}})
            ]
        );
        let applied = apply(
            Some(&created),
            &deploy(json!({"minReadySeconds": 4})),
            false,
            &op("a", "t2"),
        )
        .expect("apply succeeds");
        let mut updated = applied.clone();
        updated["spec"]["minReadySeconds"] = json!(9);
        updated["spec"]
            .as_object_mut()
            .expect("spec is an object")
            .shift_remove("paused");
        record_update(Some(&applied), &mut updated, &op("ctl", "t3"));
        let mf = managed(&updated);
        // Apply sorts before Update; a lost its only field so its entry is gone.
        assert_eq!(mf.len(), 1);
        assert_eq!(mf[0]["time"], "t3");
        assert_eq!(
            mf[0]["fieldsV1"],
            json!({"f:spec": {"f:minReadySeconds": {}, "f:replicas": {}}})
        );
        // A no-op update keeps the timestamp.
        let mut same = updated.clone();
        record_update(Some(&updated), &mut same, &op("ctl", "t4"));
        assert_eq!(managed(&same)[0]["time"], "t3");
    }

    #[test]
    fn entries_sorted_apply_before_update() {
        let mut created = deploy(json!({"replicas": 1}));
        record_update(None, &mut created, &op("ctl", "t1"));
        let out = apply(
            Some(&created),
            &deploy(json!({"paused": true})),
            false,
            &op("a", "t2"),
        )
        .expect("apply succeeds");
        let ops: Vec<_> = managed(&out)
            .iter()
            .map(|e| e["operation"].clone())
            .collect();
        assert_eq!(ops, vec![json!("Apply"), json!("Update")]);
    }

    #[test]
    fn subresource_is_recorded_and_separates_entries() {
        let live = apply(None, &deploy(json!({"replicas": 1})), false, &op("a", "t1"))
            .expect("apply succeeds");
        let status_op = Op {
            subresource: Some("status"),
            ..op("a", "t2")
        };
        let cfg = json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d"}, "status": {"ready": 1}});
        let out = apply(Some(&live), &cfg, false, &status_op).expect("apply succeeds");
        let mf = managed(&out);
        assert_eq!(mf.len(), 2);
        assert_eq!(out["spec"]["replicas"], 1);
        assert!(mf.iter().any(|e| e["subresource"] == "status"));
    }

    #[test]
    fn conflict_status_parts_matches_apiserver() {
        let one = [Conflict {
            manager: "m".into(),
            field: ".spec.replicas".into(),
        }];
        let (msg, causes) = conflict_status_parts(&one);
        assert_eq!(
            msg,
            "Apply failed with 1 conflict: conflict with \"m\": .spec.replicas"
        );
        assert_eq!(
            causes,
            vec![
                json!({"type": "FieldManagerConflict", "message": "conflict with \"m\"",
                        "field": ".spec.replicas"})
            ]
        );
        let many = [
            Conflict {
                manager: "z".into(),
                field: ".a".into(),
            },
            Conflict {
                manager: "m".into(),
                field: ".b".into(),
            },
            Conflict {
                manager: "m".into(),
                field: ".c".into(),
            },
        ];
        let (msg, causes) = conflict_status_parts(&many);
        assert_eq!(
            msg,
            "Apply failed with 3 conflicts: conflicts with \"m\":\n- .b\n- .c\nconflicts with \"z\":\n- .a"
        );
        assert_eq!(causes.len(), 3);
    }

    #[test]
    fn key_ordering_is_numeric_like_k8s() {
        let mut set = Node::default();
        for port in [8080, 80, 443] {
            set.insert(&[
                Pe::Field("ports".into()),
                key_pe(vec![("port".into(), json!(port))]),
            ]);
        }
        let wire = serde_json::to_string(&set.to_json()).expect("serializes");
        assert_eq!(
            wire,
            r#"{"f:ports":{"k:{\"port\":80}":{},"k:{\"port\":443}":{},"k:{\"port\":8080}":{}}}"#
        );
        assert_eq!(Node::from_json(&set.to_json()).expect("round-trips"), set);
    }

    #[test]
    fn update_takes_only_changed_item_fields() {
        let cfg = deploy(json!({"template": {"spec": {"containers": [
            {"name": "web", "image": "nginx", "tty": true}]}}}));
        let live = apply(None, &cfg, false, &op("a", "t1")).expect("apply succeeds");
        let mut edited = live.clone();
        edited["spec"]["template"]["spec"]["containers"][0]["image"] = json!("httpd");
        record_update(Some(&live), &mut edited, &op("kubectl-edit", "t2"));
        let item = "k:{\"name\":\"web\"}";
        assert_eq!(
            fields_of(&edited, "kubectl-edit", "Update").expect("manager entry exists"),
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
                item: {"f:image": {}}}}}}})
        );
        assert_eq!(
            fields_of(&edited, "a", "Apply").expect("manager entry exists"),
            json!({"f:spec": {"f:template": {"f:spec": {"f:containers": {
                item: {".": {}, "f:name": {}, "f:tty": {}}}}}}})
        );
        // The client echoing back the stored managedFields is not an override.
        let mut echoed = edited.clone();
        echoed["spec"]["paused"] = json!(true);
        record_update(Some(&edited), &mut echoed, &op("kubectl-edit", "t3"));
        assert_eq!(managed(&echoed).len(), 2);
    }

    #[test]
    fn empty_map_is_an_owned_leaf() {
        let out = apply(None, &deploy(json!({"strategy": {}})), false, &op("a", "t"))
            .expect("apply succeeds");
        assert_eq!(
            fields_of(&out, "a", "Apply").expect("manager entry exists"),
            json!({"f:spec": {"f:strategy": {}}})
        );
        let dropped = apply(Some(&out), &bare(), false, &op("a", "t2")).expect("apply succeeds");
        assert_eq!(dropped["spec"], json!({}));
    }
}
