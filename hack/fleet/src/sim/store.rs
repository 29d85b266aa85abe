//! The object store of one simulated SKR and the write semantics of a kube-apiserver,
//! simplified where the catalog sync does not look: server-side apply replaces the whole
//! content (no field-level merge between managers, so `force` has nothing to do), and a
//! write that changes neither the content nor the recorded managers is a no-op that keeps
//! the resourceVersion, as a real apiserver does.
//!
//! The one kind with a status subresource, the SKR Kyma that lifecycle-manager's reconcile
//! reads and writes, keeps its parts apart as an apiserver does: a write to the object
//! leaves the stored status alone (a create drops the one it was sent), a write to
//! `/status` changes nothing but the status, and an apply merges the labels, annotations
//! and top-level fields it sends into the stored object (it adds and changes fields, it never
//! removes one: there is no field ownership here).
//!
//! Content (everything but the server-set metadata) is interned in an [`Interner`], so the
//! same ModuleTemplate held by 5,000 SKRs is one allocation.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};

use serde_json::{Map, Value, json};

use super::{MARK_ANNOTATION, SkrCounts};

/// Locks a mutex, ignoring poisoning: every critical section here leaves the data valid.
pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The resources the simulator serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum Res {
    Namespaces,
    Crds,
    ModuleTemplates,
    ModuleReleaseMetas,
    /// The SKR Kyma (`kyma-system/default`), which lifecycle-manager's Kyma reconcile keeps.
    Kymas,
}

/// Group/version of the `operator.kyma-project.io` kinds.
const OPERATOR_API_VERSION: &str = "operator.kyma-project.io/v1beta2";

impl Res {
    /// All resources, in [`Res::index`] order.
    pub const ALL: [Res; 5] = [Res::Namespaces, Res::Crds, Res::ModuleTemplates, Res::ModuleReleaseMetas, Res::Kymas];

    pub fn index(self) -> usize {
        self as usize
    }

    pub fn plural(self) -> &'static str {
        match self {
            Res::Namespaces => "namespaces",
            Res::Crds => "customresourcedefinitions",
            Res::ModuleTemplates => "moduletemplates",
            Res::ModuleReleaseMetas => "modulereleasemetas",
            Res::Kymas => "kymas",
        }
    }

    pub fn api_version(self) -> &'static str {
        match self {
            Res::Namespaces => "v1",
            Res::Crds => "apiextensions.k8s.io/v1",
            Res::ModuleTemplates | Res::ModuleReleaseMetas | Res::Kymas => OPERATOR_API_VERSION,
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            Res::Namespaces => "Namespace",
            Res::Crds => "CustomResourceDefinition",
            Res::ModuleTemplates => "ModuleTemplate",
            Res::ModuleReleaseMetas => "ModuleReleaseMeta",
            Res::Kymas => "Kyma",
        }
    }

    pub fn namespaced(self) -> bool {
        matches!(self, Res::ModuleTemplates | Res::ModuleReleaseMetas | Res::Kymas)
    }

    /// Whether the resource is one of the catalog kinds that are copied from the KCP.
    pub fn is_catalog(self) -> bool {
        matches!(self, Res::ModuleTemplates | Res::ModuleReleaseMetas)
    }

    /// Whether the resource has a status subresource.
    pub fn has_status(self) -> bool {
        self == Res::Kymas
    }

    /// The CRD that must exist for the resource to be served.
    pub fn crd_name(self) -> Option<&'static str> {
        match self {
            Res::ModuleTemplates => Some("moduletemplates.operator.kyma-project.io"),
            Res::ModuleReleaseMetas => Some("modulereleasemetas.operator.kyma-project.io"),
            Res::Kymas => Some("kymas.operator.kyma-project.io"),
            Res::Namespaces | Res::Crds => None,
        }
    }

    pub fn from_plural(plural: &str) -> Option<Res> {
        Res::ALL.into_iter().find(|r| r.plural() == plural)
    }

    pub fn from_type(api_version: &str, kind: &str) -> Option<Res> {
        Res::ALL.into_iter().find(|r| r.api_version() == api_version && r.kind() == kind)
    }

    /// `<plural>.<group>` for a CRD name, the resource it serves.
    fn served_by_crd(crd_name: &str) -> Option<Res> {
        Res::ALL.into_iter().find(|r| r.crd_name() == Some(crd_name))
    }
}

/// A Kubernetes API error, rendered as a `Status`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into() }
    }

    pub fn not_found(what: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{what} \"{name}\" not found"))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    fn conflict(res: Res, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                res.plural()
            ),
        )
    }

    fn already_exists(res: Res, name: &str) -> Self {
        Self::new(409, "AlreadyExists", format!("{} \"{name}\" already exists", res.plural()))
    }
}

/// Interns JSON content by a content hash, so identical copies share one allocation. Entries
/// are weak; dead ones are swept every so often.
#[derive(Default)]
pub(super) struct Interner {
    values: Mutex<ValueTable>,
    strings: Mutex<HashSet<Arc<str>>>,
    /// Stored content by the request that applied it ([`Interner::applied`]).
    applied: Mutex<AppliedTable>,
}

#[derive(Default)]
struct AppliedTable {
    by_request: HashMap<u64, (usize, Weak<Value>)>,
    inserts_since_sweep: usize,
}

#[derive(Default)]
struct ValueTable {
    by_hash: HashMap<u64, Vec<Weak<Value>>>,
    inserts_since_sweep: usize,
}

/// Sweep the weak table after this many inserts (or the table size, when larger), so
/// sweeping costs O(1) amortised per insert.
const SWEEP_EVERY: usize = 4096;

impl Interner {
    /// The shared copy of `value`.
    pub fn intern(&self, value: Value) -> Arc<Value> {
        let hash = catalogsync::catalog::content_hash(&value);
        let candidates: Vec<Arc<Value>> =
            lock(&self.values).by_hash.get(&hash).into_iter().flatten().filter_map(Weak::upgrade).collect();
        // Compare outside the lock: contents are large.
        if let Some(found) = candidates.into_iter().find(|c| **c == value) {
            return found;
        }
        let shared = Arc::new(value);
        let mut table = lock(&self.values);
        table.by_hash.entry(hash).or_default().push(Arc::downgrade(&shared));
        table.inserts_since_sweep += 1;
        if table.inserts_since_sweep > SWEEP_EVERY.max(table.by_hash.len()) {
            table.by_hash.retain(|_, v| {
                v.retain(|w| w.strong_count() > 0);
                !v.is_empty()
            });
            table.inserts_since_sweep = 0;
        }
        shared
    }

    /// The key of an apply request of `body` to `res` `namespace/name`.
    pub fn apply_key(res: Res, namespace: &str, name: &str, body: &[u8]) -> (u64, usize) {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&[u8::try_from(res.index()).unwrap_or(u8::MAX)]);
        for part in [namespace.as_bytes(), b"\0", name.as_bytes(), b"\0", body] {
            h.update(part);
        }
        (h.digest(), body.len())
    }

    /// The stored content an earlier apply request with this key produced, if some SKR
    /// still holds it. A kube-apiserver parses and compares every apply; the simulator
    /// answers for thousands of SKRs that are sent the same bytes, and spares itself the
    /// parsing, hashing and comparing of ~30 KB per request, which on one machine would
    /// take the CPU the replicas measured next to it need.
    pub fn applied(&self, key: (u64, usize)) -> Option<Arc<Value>> {
        let table = lock(&self.applied);
        table.by_request.get(&key.0).filter(|(len, _)| *len == key.1).and_then(|(_, weak)| weak.upgrade())
    }

    /// Remembers that the apply request with `key` stored `content`.
    pub fn remember_applied(&self, key: (u64, usize), content: &Arc<Value>) {
        let mut table = lock(&self.applied);
        table.by_request.insert(key.0, (key.1, Arc::downgrade(content)));
        table.inserts_since_sweep += 1;
        if table.inserts_since_sweep > SWEEP_EVERY.max(table.by_request.len()) {
            table.by_request.retain(|_, (_, w)| w.strong_count() > 0);
            table.inserts_since_sweep = 0;
        }
    }

    /// The shared copy of a name (names and managers are few and small; kept forever).
    pub fn intern_str(&self, s: &str) -> Arc<str> {
        let mut strings = lock(&self.strings);
        if let Some(found) = strings.get(s) {
            return found.clone();
        }
        let shared: Arc<str> = Arc::from(s);
        strings.insert(shared.clone());
        shared
    }
}

/// How a field manager wrote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Op {
    Apply,
    Update,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Apply => "Apply",
            Op::Update => "Update",
        }
    }
}

/// One `managedFields` entry.
#[derive(Clone, Debug)]
pub(super) struct Manager {
    pub name: Arc<str>,
    pub op: Op,
    pub time_ms: u64,
}

/// One stored object: shared content plus its own server metadata.
#[derive(Clone, Debug)]
pub(super) struct Entry {
    pub res: Res,
    /// Everything but server-set metadata, interned.
    pub content: Arc<Value>,
    pub resource_version: u64,
    pub uid: u64,
    pub created_ms: u64,
    pub generation: i64,
    pub managers: Vec<Manager>,
    /// When the mark annotation last changed (or the object was created).
    pub mark_since_ms: u64,
}

impl Entry {
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.content.pointer("/metadata/annotations").and_then(|a| a.get(key)).and_then(Value::as_str)
    }
}

/// The objects of one namespace (`""` for cluster-scoped), by name.
type ByName = BTreeMap<Arc<str>, Entry>;

/// The state of one SKR.
#[derive(Default)]
pub(super) struct Skr {
    resource_version: u64,
    objects: [BTreeMap<Arc<str>, ByName>; Res::ALL.len()],
    /// Request counters of this SKR.
    pub counts: SkrCounts,
}

/// UIDs are unique across the process.
static NEXT_UID: AtomicU64 = AtomicU64::new(1);

/// What kind of write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum WriteKind {
    /// Server-side apply (creates when absent).
    Apply,
    /// PUT: replace an existing object.
    Replace,
    /// POST: create a new object.
    Create,
    /// PUT to `/status`: replace the status of an existing object.
    Status,
}

/// One write request, without its body.
pub(super) struct WriteHead<'a> {
    pub kind: WriteKind,
    pub res: Res,
    /// Namespace, `""` for cluster-scoped resources.
    pub namespace: &'a str,
    pub name: &'a str,
    pub manager: &'a str,
    pub now_ms: u64,
}

/// Written content: parsed from this request, or shared with earlier writes of the same body.
enum Content {
    Parsed(Value),
    Shared(Arc<Value>),
}

impl Content {
    /// Whether the stored `content` is this one.
    fn is(&self, stored: &Arc<Value>) -> bool {
        match self {
            Content::Parsed(value) => **stored == *value,
            Content::Shared(shared) => Arc::ptr_eq(shared, stored) || **stored == **shared,
        }
    }

    fn interned(self, interner: &Interner) -> Arc<Value> {
        match self {
            Content::Parsed(value) => interner.intern(value),
            Content::Shared(shared) => shared,
        }
    }
}

impl std::ops::Deref for Content {
    type Target = Value;
    fn deref(&self) -> &Value {
        match self {
            Content::Parsed(value) => value,
            Content::Shared(shared) => shared,
        }
    }
}

/// What a write did.
pub(super) struct Outcome {
    /// The stored object after the write.
    pub entry: Entry,
    /// Whether stored state changed.
    pub changed: bool,
    /// Whether the object was created.
    pub created: bool,
}

/// Metadata fields the server owns; dropped from written bodies.
const SERVER_METADATA: [&str; 8] = [
    "resourceVersion",
    "uid",
    "managedFields",
    "creationTimestamp",
    "generation",
    "selfLink",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
];

impl Skr {
    /// The current resourceVersion of the SKR (for list metadata).
    pub fn resource_version(&self) -> u64 {
        self.resource_version
    }

    fn bump(&mut self) -> u64 {
        self.resource_version += 1;
        self.resource_version
    }

    /// Whether the SKR serves `res` (a catalog kind is served only while its CRD exists).
    pub fn serves(&self, res: Res) -> bool {
        res.crd_name().is_none_or(|crd| self.get(Res::Crds, "", crd).is_some())
    }

    pub fn get(&self, res: Res, namespace: &str, name: &str) -> Option<&Entry> {
        self.objects[res.index()].get(namespace)?.get(name)
    }

    /// The objects of `res` in `namespace` (all namespaces when `None`), in (namespace, name)
    /// order.
    pub fn list(&self, res: Res, namespace: Option<&str>) -> impl Iterator<Item = &Entry> {
        self.objects[res.index()]
            .iter()
            .filter(move |(ns, _)| namespace.is_none_or(|want| want == &***ns))
            .flat_map(|(_, by_name)| by_name.values())
    }

    /// The objects of `res` named `name`, in any namespace.
    pub fn named<'a>(&'a self, res: Res, name: &'a str) -> impl Iterator<Item = &'a Entry> {
        self.objects[res.index()].values().filter_map(move |by_name| by_name.get(name))
    }

    /// `(namespace, name)` of every object of `res`.
    pub fn names(&self, res: Res) -> impl Iterator<Item = (&str, &str)> {
        self.objects[res.index()].iter().flat_map(|(ns, by_name)| by_name.keys().map(move |n| (&**ns, &**n)))
    }

    /// Performs a write.
    ///
    /// # Errors
    /// The API error a kube-apiserver would answer with.
    pub fn write(&mut self, head: &WriteHead<'_>, body: Value, interner: &Interner) -> Result<Outcome, ApiError> {
        let (content, precondition) = normalize(head.res, head.namespace, head.name, body)?;
        self.write_content(head, Content::Parsed(content), precondition.as_deref(), interner)
    }

    /// Performs a server-side apply of content already normalized and interned: a body this
    /// simulator was sent before, for the same object, without a resourceVersion (the same
    /// serialized copy goes to thousands of SKRs; see [`Interner::applied`]).
    ///
    /// # Errors
    /// The API error a kube-apiserver would answer with.
    pub fn apply_shared(
        &mut self,
        head: &WriteHead<'_>,
        content: Arc<Value>,
        interner: &Interner,
    ) -> Result<Outcome, ApiError> {
        self.write_content(head, Content::Shared(content), None, interner)
    }

    fn write_content(
        &mut self,
        w: &WriteHead<'_>,
        content: Content,
        precondition: Option<&str>,
        interner: &Interner,
    ) -> Result<Outcome, ApiError> {
        let existing = self.get(w.res, w.namespace, w.name);
        match (w.kind, existing) {
            (WriteKind::Create, Some(_)) => return Err(ApiError::already_exists(w.res, w.name)),
            (WriteKind::Replace | WriteKind::Status, None) => return Err(ApiError::not_found(w.res.plural(), w.name)),
            _ => {}
        }
        if let Some(want) = precondition
            && existing.is_none_or(|e| e.resource_version.to_string() != *want)
        {
            return Err(ApiError::conflict(w.res, w.name));
        }
        if existing.is_none() && w.res.namespaced() && self.get(Res::Namespaces, "", w.namespace).is_none() {
            return Err(ApiError::not_found("namespaces", w.namespace));
        }
        let op = if w.kind == WriteKind::Apply { Op::Apply } else { Op::Update };
        let created_ms = existing.map_or(w.now_ms, |e| e.created_ms);
        let content = match content {
            Content::Parsed(value) => {
                let value = with_subresources(w.kind, w.res, existing.map(|e| &*e.content), value);
                let since = existing.and_then(|e| condition_time(&e.content)).unwrap_or_else(|| rfc3339(created_ms));
                Content::Parsed(with_server_defaults(w.res, w.name, value, &since))
            }
            // Only catalog objects are shared, and the server adds nothing to them.
            shared @ Content::Shared(_) => shared,
        };

        let same_content = existing.is_some_and(|e| content.is(&e.content));
        let has_manager = existing.is_some_and(|e| e.managers.iter().any(|m| &*m.name == w.manager && m.op == op));
        if let Some(e) = existing
            && same_content
            && has_manager
        {
            return Ok(Outcome { entry: e.clone(), changed: false, created: false });
        }

        let entry = match existing {
            Some(old) => {
                let content = if same_content { old.content.clone() } else { content.interned(interner) };
                let mut managers = old.managers.clone();
                match managers.iter_mut().find(|m| &*m.name == w.manager && m.op == op) {
                    Some(m) => m.time_ms = w.now_ms,
                    None => managers.push(Manager { name: interner.intern_str(w.manager), op, time_ms: w.now_ms }),
                }
                let mark_changed = old.annotation(MARK_ANNOTATION) != mark_of(&content);
                Entry {
                    res: w.res,
                    generation: if old.content.get("spec") == content.get("spec") {
                        old.generation
                    } else {
                        old.generation + 1
                    },
                    mark_since_ms: if mark_changed { w.now_ms } else { old.mark_since_ms },
                    content,
                    resource_version: 0,
                    uid: old.uid,
                    created_ms,
                    managers,
                }
            }
            None => Entry {
                res: w.res,
                content: content.interned(interner),
                resource_version: 0,
                uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
                created_ms,
                generation: 1,
                managers: vec![Manager { name: interner.intern_str(w.manager), op, time_ms: w.now_ms }],
                mark_since_ms: w.now_ms,
            },
        };
        let created = existing.is_none();
        Ok(Outcome { entry: self.store(w.namespace, w.name, entry, interner), changed: true, created })
    }

    /// Stores `entry` under a fresh resourceVersion; returns the stored copy.
    fn store(&mut self, namespace: &str, name: &str, mut entry: Entry, interner: &Interner) -> Entry {
        entry.resource_version = self.bump();
        let by_ns = &mut self.objects[entry.res.index()];
        let by_name = match by_ns.get_mut(namespace) {
            Some(m) => m,
            None => by_ns.entry(interner.intern_str(namespace)).or_default(),
        };
        match by_name.get_mut(name) {
            Some(slot) => *slot = entry.clone(),
            None => {
                by_name.insert(interner.intern_str(name), entry.clone());
            }
        }
        entry
    }

    /// Deletes an object; deleting a CRD drops the objects it served, deleting a namespace
    /// the objects in it (a real apiserver does both, asynchronously).
    ///
    /// # Errors
    /// NotFound when absent.
    pub fn delete(&mut self, res: Res, namespace: &str, name: &str) -> Result<Entry, ApiError> {
        let by_ns = &mut self.objects[res.index()];
        let removed = by_ns.get_mut(namespace).and_then(|m| m.remove(name));
        let mut entry = removed.ok_or_else(|| ApiError::not_found(res.plural(), name))?;
        if by_ns.get(namespace).is_some_and(BTreeMap::is_empty) {
            by_ns.remove(namespace);
        }
        entry.resource_version = self.bump();
        if res == Res::Crds
            && let Some(served) = Res::served_by_crd(name)
        {
            self.objects[served.index()].clear();
        }
        if res == Res::Namespaces {
            for r in Res::ALL.into_iter().filter(|r| r.namespaced()) {
                self.objects[r.index()].remove(name);
            }
        }
        Ok(entry)
    }

    /// Inserts a seed object (no checks).
    pub fn seed(&mut self, seed: &SeedObject, now_ms: u64, interner: &Interner) {
        let entry = Entry {
            res: seed.res,
            content: seed.content.clone(),
            resource_version: 0,
            uid: NEXT_UID.fetch_add(1, Ordering::Relaxed),
            created_ms: now_ms,
            generation: 1,
            managers: vec![Manager { name: seed.manager.clone(), op: Op::Apply, time_ms: now_ms }],
            mark_since_ms: now_ms,
        };
        self.store(&seed.namespace, &seed.name, entry, interner);
    }
}

fn mark_of(content: &Value) -> Option<&str> {
    content.pointer("/metadata/annotations").and_then(|a| a.get(MARK_ANNOTATION)).and_then(Value::as_str)
}

/// Checks a written body against the URL and strips server-owned metadata. Returns the
/// content and the resourceVersion precondition, if any.
fn normalize(res: Res, namespace: &str, name: &str, body: Value) -> Result<(Value, Option<String>), ApiError> {
    let Value::Object(mut body) = body else { return Err(ApiError::bad_request("the body must be a JSON object")) };
    let api_version = body.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
    let kind = body.get("kind").and_then(Value::as_str).unwrap_or_default();
    if api_version != res.api_version() || kind != res.kind() {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({api_version}) and kind ({kind}) do not match the expected {}, {}",
            res.api_version(),
            res.kind()
        )));
    }
    let meta = body.entry("metadata").or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(meta) = meta else { return Err(ApiError::bad_request("metadata must be an object")) };
    match meta.get("name").and_then(Value::as_str) {
        Some(n) if n != name => {
            return Err(ApiError::bad_request(format!("the name of the object ({n}) does not match the URL ({name})")));
        }
        _ => {
            meta.insert("name".into(), json!(name));
        }
    }
    if res.namespaced() {
        match meta.get("namespace").and_then(Value::as_str) {
            Some(ns) if !ns.is_empty() && ns != namespace => {
                return Err(ApiError::bad_request(format!(
                    "the namespace of the object ({ns}) does not match the namespace on the request ({namespace})"
                )));
            }
            _ => {
                meta.insert("namespace".into(), json!(namespace));
            }
        }
    } else {
        meta.remove("namespace");
    }
    let precondition =
        meta.remove("resourceVersion").and_then(|v| v.as_str().map(str::to_owned)).filter(|v| !v.is_empty());
    for field in SERVER_METADATA {
        meta.remove(field);
    }
    // Go's ObjectMeta omits empty maps and lists.
    for field in ["labels", "annotations", "finalizers", "ownerReferences"] {
        if meta.get(field).is_some_and(|v| {
            v.as_object().is_some_and(Map::is_empty) || v.as_array().is_some_and(Vec::is_empty) || v.is_null()
        }) {
            meta.remove(field);
        }
    }
    Ok((Value::Object(body), precondition))
}

/// The content a write stores for a resource with a status subresource (for others, `sent`
/// as it is): a write to `/status` changes only the status of the `stored` object, a write
/// to the object keeps the stored status (none on a create), and an apply to an existing
/// object merges the labels, annotations and top-level fields it sends into it.
fn with_subresources(kind: WriteKind, res: Res, stored: Option<&Value>, mut sent: Value) -> Value {
    if !res.has_status() {
        return sent;
    }
    let mut content = match (kind, stored) {
        (WriteKind::Status, Some(stored)) => {
            let mut content = stored.clone();
            set_or_remove(&mut content, "status", sent.get_mut("status").map(Value::take));
            return content;
        }
        (WriteKind::Apply, Some(stored)) => {
            let mut content = stored.clone();
            merge_applied(&mut content, sent);
            content
        }
        _ => {
            set_or_remove(&mut sent, "status", None);
            sent
        }
    };
    set_or_remove(&mut content, "status", stored.and_then(|s| s.get("status")).cloned());
    content
}

/// Sets `key` of an object to `value`, or removes it when `None`.
fn set_or_remove(object: &mut Value, key: &str, value: Option<Value>) {
    if let Value::Object(map) = object {
        match value {
            Some(value) => map.insert(key.to_owned(), value),
            None => map.remove(key),
        };
    }
}

/// Merges an applied configuration into stored content: labels and annotations key by key,
/// every other field (status aside) replaced as sent.
fn merge_applied(stored: &mut Value, sent: Value) {
    let Value::Object(sent) = sent else { return };
    for (key, value) in sent {
        match (key.as_str(), value) {
            ("status", _) => {}
            ("metadata", Value::Object(meta)) => {
                for (field, value) in meta {
                    match (field.as_str(), value) {
                        ("labels" | "annotations", Value::Object(entries)) => {
                            for (k, v) in entries {
                                stored["metadata"][field.as_str()][k] = v;
                            }
                        }
                        (_, value) => stored["metadata"][field.as_str()] = value,
                    }
                }
            }
            (_, value) => stored[key.as_str()] = value,
        }
    }
}

/// Adds what the apiserver and its controllers add: a namespace's name label, finalizer and
/// phase; a CRD's accepted names and Established/NamesAccepted conditions, which turned true
/// at `since` (kept from the stored object, so the content of a re-applied CRD stays equal).
fn with_server_defaults(res: Res, name: &str, mut content: Value, since: &str) -> Value {
    match res {
        Res::Namespaces => {
            content["metadata"]["labels"]["kubernetes.io/metadata.name"] = json!(name);
            if content.pointer("/spec/finalizers").is_none() {
                content["spec"]["finalizers"] = json!(["kubernetes"]);
            }
            content["status"] = json!({"phase": "Active"});
        }
        Res::Crds => {
            let time = since;
            let stored: Vec<Value> = content
                .pointer("/spec/versions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|v| v.get("storage").and_then(Value::as_bool) == Some(true))
                .filter_map(|v| v.get("name").cloned())
                .collect();
            content["status"] = json!({
                "acceptedNames": content.pointer("/spec/names").cloned().unwrap_or_else(|| json!({})),
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                     "message": "no conflicts found", "lastTransitionTime": time},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                     "message": "the initial names have been accepted", "lastTransitionTime": time},
                ],
                "storedVersions": stored,
            });
        }
        Res::ModuleTemplates | Res::ModuleReleaseMetas | Res::Kymas => {}
    }
    content
}

/// When the stored conditions of a CRD turned true.
fn condition_time(content: &Value) -> Option<String> {
    content.pointer("/status/conditions/0/lastTransitionTime").and_then(Value::as_str).map(str::to_owned)
}

/// RFC 3339 UTC time, second precision, as the apiserver renders timestamps.
pub(super) fn rfc3339(unix_ms: u64) -> String {
    let secs = i64::try_from(unix_ms / 1000).unwrap_or_default();
    k8s_openapi::jiff::Timestamp::from_second(secs).map(|t| t.to_string()).unwrap_or_default()
}

/// One object every new SKR starts with.
#[derive(Clone, Debug)]
pub(super) struct SeedObject {
    pub res: Res,
    pub namespace: String,
    pub name: String,
    pub manager: Arc<str>,
    pub content: Arc<Value>,
}

impl SeedObject {
    /// Builds a seed object from a full Kubernetes object.
    ///
    /// # Errors
    /// When the object is not of a served kind or is malformed.
    pub fn new(manager: &str, object: Value, now_ms: u64, interner: &Interner) -> Result<Self, ApiError> {
        let api_version = object.get("apiVersion").and_then(Value::as_str).unwrap_or_default();
        let kind = object.get("kind").and_then(Value::as_str).unwrap_or_default();
        let res = Res::from_type(api_version, kind)
            .ok_or_else(|| ApiError::bad_request(format!("unsupported seed kind {api_version}/{kind}")))?;
        let name = object.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_owned();
        if name.is_empty() {
            return Err(ApiError::bad_request("a seed object has no metadata.name"));
        }
        let namespace = if res.namespaced() {
            object.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or("default").to_owned()
        } else {
            String::new()
        };
        let (content, _) = normalize(res, &namespace, &name, object)?;
        let content = with_server_defaults(res, &name, content, &rfc3339(now_ms));
        Ok(Self { res, namespace, name, manager: interner.intern_str(manager), content: interner.intern(content) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mt(name: &str, spec: Value) -> Value {
        json!({"apiVersion": OPERATOR_API_VERSION, "kind": "ModuleTemplate", "metadata": {"name": name}, "spec": spec})
    }

    fn skr_with_catalog(interner: &Interner) -> Skr {
        let mut skr = Skr::default();
        for body in [
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kyma-system"}}),
            json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                   "metadata": {"name": "moduletemplates.operator.kyma-project.io"}, "spec": {}}),
        ] {
            let seed = SeedObject::new("seed", body, 0, interner).unwrap();
            skr.seed(&seed, 0, interner);
        }
        skr
    }

    fn apply(skr: &mut Skr, interner: &Interner, body: Value) -> Result<Outcome, ApiError> {
        let name = body["metadata"]["name"].as_str().unwrap().to_owned();
        let head = WriteHead {
            kind: WriteKind::Apply,
            res: Res::ModuleTemplates,
            namespace: "kyma-system",
            name: &name,
            manager: "m",
            now_ms: 1,
        };
        skr.write(&head, body, interner)
    }

    #[test]
    fn unchanged_apply_keeps_resource_version_and_shares_content() {
        let interner = Interner::default();
        let mut a = skr_with_catalog(&interner);
        let mut b = skr_with_catalog(&interner);
        let first = apply(&mut a, &interner, mt("x", json!({"v": 1}))).unwrap();
        let again = apply(&mut a, &interner, mt("x", json!({"v": 1}))).unwrap();
        assert!(first.changed && !again.changed);
        assert_eq!(first.entry.resource_version, again.entry.resource_version);
        let other = apply(&mut b, &interner, mt("x", json!({"v": 1}))).unwrap();
        assert!(Arc::ptr_eq(&first.entry.content, &other.entry.content));
        let changed = apply(&mut a, &interner, mt("x", json!({"v": 2}))).unwrap();
        assert!(changed.changed && changed.entry.resource_version > first.entry.resource_version);
        assert_eq!(changed.entry.generation, 2);
    }

    #[test]
    fn a_body_applied_before_is_stored_as_if_parsed_again() {
        let interner = Interner::default();
        let (mut a, mut b) = (skr_with_catalog(&interner), skr_with_catalog(&interner));
        let body = mt("x", json!({"v": 1}));
        let bytes = serde_json::to_vec(&body).unwrap();
        let key = Interner::apply_key(Res::ModuleTemplates, "kyma-system", "x", &bytes);
        assert!(interner.applied(key).is_none());
        let first = apply(&mut a, &interner, body).unwrap();
        interner.remember_applied(key, &first.entry.content);
        let head = WriteHead {
            kind: WriteKind::Apply,
            res: Res::ModuleTemplates,
            namespace: "kyma-system",
            name: "x",
            manager: "m",
            now_ms: 1,
        };
        let shared = interner.applied(key).expect("remembered while an SKR holds it");
        let other = b.apply_shared(&head, Arc::clone(&shared), &interner).unwrap();
        assert!(other.changed && other.created && Arc::ptr_eq(&other.entry.content, &first.entry.content));
        let again = b.apply_shared(&head, shared, &interner).unwrap();
        assert!(!again.changed, "a repeated apply is a no-op");
        assert_eq!(again.entry.resource_version, other.entry.resource_version);
        // Another name or namespace is another request.
        assert!(interner.applied(Interner::apply_key(Res::ModuleTemplates, "kyma-system", "y", &bytes)).is_none());
        drop((a, b, first, other, again));
        assert!(interner.applied(key).is_none(), "forgotten once no SKR holds the content");
    }

    #[test]
    fn reapplying_a_seeded_crd_is_a_no_op() {
        let interner = Interner::default();
        let body = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                          "metadata": {"name": "moduletemplates.operator.kyma-project.io"},
                          "spec": {"names": {"kind": "ModuleTemplate"}}});
        let seed = SeedObject::new("catalog-sync", body.clone(), 1_000, &interner).unwrap();
        let mut skr = Skr::default();
        skr.seed(&seed, 90_000, &interner);
        let head = WriteHead {
            kind: WriteKind::Apply,
            res: Res::Crds,
            namespace: "",
            name: "moduletemplates.operator.kyma-project.io",
            manager: "catalog-sync",
            now_ms: 200_000,
        };
        let outcome = skr.write(&head, body, &interner).unwrap();
        assert!(!outcome.changed);
        assert_eq!(outcome.entry.content["status"]["acceptedNames"]["kind"], "ModuleTemplate");
    }

    #[test]
    fn a_kyma_keeps_status_and_the_rest_apart() {
        let interner = Interner::default();
        let mut skr = skr_with_catalog(&interner);
        let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                         "metadata": {"name": "kymas.operator.kyma-project.io"}, "spec": {}});
        skr.seed(&SeedObject::new("seed", crd, 0, &interner).unwrap(), 0, &interner);
        let head = |kind, manager| WriteHead {
            kind,
            res: Res::Kymas,
            namespace: "kyma-system",
            name: "default",
            manager,
            now_ms: 1,
        };
        let kyma = |extra: Value| {
            let mut body = json!({"apiVersion": OPERATOR_API_VERSION, "kind": "Kyma",
                                  "metadata": {"name": "default", "namespace": "kyma-system"}});
            body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            body
        };
        let sent = kyma(json!({"spec": {"channel": "regular"}, "status": {"state": "Ready"}}));
        let created = skr.write(&head(WriteKind::Create, "klm"), sent, &interner).unwrap();
        assert!(created.created && created.entry.content.get("status").is_none(), "a create drops the status");

        let rv = created.entry.resource_version.to_string();
        let status = kyma(json!({"metadata": {"resourceVersion": rv}, "spec": {"channel": "fast"},
                                 "status": {"state": "Ready"}}));
        let updated = skr.write(&head(WriteKind::Status, "klm"), status.clone(), &interner).unwrap();
        assert!(updated.changed && updated.entry.content["status"]["state"] == "Ready");
        assert_eq!(updated.entry.content["spec"]["channel"], "regular", "a status write changes only the status");
        assert_eq!(updated.entry.generation, 1);
        let stale = skr.write(&head(WriteKind::Status, "klm"), status, &interner).err().unwrap();
        assert_eq!(stale.code, 409);

        let labels = kyma(json!({"metadata": {"labels": {"a": "b"}}}));
        let applied = skr.write(&head(WriteKind::Apply, "sync"), labels.clone(), &interner).unwrap();
        assert!(applied.changed);
        assert_eq!(applied.entry.content["metadata"]["labels"]["a"], "b");
        assert_eq!(applied.entry.content["spec"]["channel"], "regular", "an apply keeps what it does not send");
        assert_eq!(applied.entry.content["status"]["state"], "Ready", "an apply keeps the status");
        let again = skr.write(&head(WriteKind::Apply, "sync"), labels, &interner).unwrap();
        assert!(!again.changed, "a repeated apply is a no-op");
    }

    #[test]
    fn catalog_kinds_need_their_crd_and_namespace() {
        let interner = Interner::default();
        let skr = Skr::default();
        assert!(!skr.serves(Res::ModuleTemplates));
        let mut skr2 = skr_with_catalog(&interner);
        assert!(skr2.serves(Res::ModuleTemplates) && !skr2.serves(Res::ModuleReleaseMetas));
        let head = WriteHead {
            kind: WriteKind::Apply,
            res: Res::ModuleTemplates,
            namespace: "other",
            name: "x",
            manager: "m",
            now_ms: 1,
        };
        let err = skr2.write(&head, mt("x", json!({})), &interner).err().unwrap();
        assert_eq!(err.code, 404);
    }
}
