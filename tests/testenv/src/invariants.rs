//! The sharding invariants, checked from audit logs alone (Guarantees 1 and 2 in
//! docs/architecture.md): the KCP audit log holds every Lease write with its body (the
//! harness logs Leases at `RequestResponse`), the SKR audit logs hold every write catalogsync
//! sent.
//!
//! - **One writer per SKR.** Every SKR write (create, update, patch, delete,
//!   deletecollection; successful or not: every write the apiserver received) by replica R
//!   for shard s counts over its whole interval: from its `requestReceivedTimestamp` to the
//!   `stageTimestamp` of its `ResponseComplete` (or `Panic`) event, when the apiserver was
//!   done with it. A write takes effect somewhere in that interval, so all of it must fall
//!   where the holder of the Lease `catalogsync-shard-<s>` was R: a write still in flight
//!   when the shard went to someone else is a violation, as is one that began before R's
//!   claim. The holder at t is the `spec.holderIdentity` of the last successful write of that
//!   Lease whose `requestReceivedTimestamp` is at or before t ("" = unheld; a deleted Lease is
//!   unheld). Lease writes count at their received time: the `stageTimestamp` of
//!   `ResponseComplete` can trail the moment the client has the response by hundreds of
//!   milliseconds on a loaded machine, so the received time is the earliest a claim can
//!   count (nothing that depends on it can reach an SKR sooner) and the strictest end of a
//!   tenure. Independently of the Leases, two writes as the same SKR user by different
//!   replicas whose intervals overlap are a double writer.
//! - **No SKR forgotten.** The longest window per shard in which its Lease had no holder (or,
//!   with [`InvariantOptions::member_liveness`], a holder whose member Lease
//!   `catalogsync-member-<identity>` was expired: `renewTime + leaseDurationSeconds < t`,
//!   released, deleted or never written).
//!
//! Who wrote: the SKR user name (each Kyma's access Secret has its own client identity) gives
//! the Kyma and so the shard (a map the test builds with the real shard function); the
//! User-Agent `catalogsync/<version> (<replica identity>)` gives the replica.
//!
//! All timestamps come from processes on this host (apiservers and replicas), so they share
//! one clock.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr as _;
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde::Deserialize;

/// How many violations [`InvariantReport`]'s `Display` lists.
const SHOWN: usize = 10;

// ---------------------------------------------------------------------------------------------
// Parsing

/// One successful write (create, update, patch, delete) of a Lease, from a KCP audit log.
#[derive(Clone, Debug, PartialEq)]
pub struct LeaseWrite {
    /// `requestReceivedTimestamp`: the write cannot have taken effect earlier.
    pub time: Timestamp,
    /// create, update, patch or delete.
    pub verb: String,
    /// HTTP response code (2xx).
    pub code: u16,
    /// Who wrote it (the authenticated user).
    pub user: String,
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// Whether the write deleted the Lease (then `holder` is "").
    pub deleted: bool,
    /// `spec.holderIdentity` of the written Lease ("" when unset).
    pub holder: String,
    /// `spec.renewTime`.
    pub renew_time: Option<Timestamp>,
    /// `spec.acquireTime`.
    pub acquire_time: Option<Timestamp>,
    /// `spec.leaseDurationSeconds`.
    pub lease_duration_seconds: Option<i64>,
    /// `metadata.annotations`.
    pub annotations: BTreeMap<String, String>,
}

impl LeaseWrite {
    /// The shard of a `catalogsync-shard-<i>` Lease.
    pub fn shard(&self) -> Option<u32> {
        catalogsync::api::shard_of_lease_name(&self.name)
    }

    /// The identity of a `catalogsync-member-<identity>` Lease.
    pub fn member(&self) -> Option<&str> {
        catalogsync::api::member_of_lease_name(&self.name)
    }

    /// Until when this write keeps the holder alive: `None` when the Lease is released or
    /// deleted (dead from `time` on); else `renewTime` (or `acquireTime`, or the write time)
    /// plus `leaseDurationSeconds`, or [`Timestamp::MAX`] without a duration.
    pub fn live_until(&self) -> Option<Timestamp> {
        if self.deleted || self.holder.is_empty() {
            return None;
        }
        let Some(seconds) = self.lease_duration_seconds else { return Some(Timestamp::MAX) };
        let base = self.renew_time.or(self.acquire_time).unwrap_or(self.time);
        Some(base.checked_add(SignedDuration::from_secs(seconds)).unwrap_or(Timestamp::MAX))
    }
}

/// One write request an SKR apiserver received, from its audit log.
#[derive(Clone, Debug, PartialEq)]
pub struct SkrWrite {
    /// `requestReceivedTimestamp`: the write cannot have taken effect earlier.
    pub time: Timestamp,
    /// `stageTimestamp` of the event that closed the request (`ResponseComplete` or `Panic`):
    /// the write cannot have taken effect later. Never before [`SkrWrite::time`].
    pub completed: Timestamp,
    /// The authenticated user (the Kyma's client identity).
    pub user: String,
    /// The User-Agent header ("" when absent).
    pub user_agent: String,
    /// The replica identity from the User-Agent, see [`replica_from_user_agent`].
    pub replica: Option<String>,
    /// create, update, patch, delete or deletecollection.
    pub verb: String,
    /// HTTP response code (0 when the event has none).
    pub code: u16,
    /// `resource[/subresource] namespace/name` of the request.
    pub target: String,
    /// The request's audit ID.
    pub audit_id: String,
    /// Which SKR (audit log) it came from.
    pub skr: String,
}

/// The replica identity in a catalogsync User-Agent `catalogsync/<version> (<identity>)`: the
/// text between the first `(` and the last `)`. `None` for any other User-Agent.
pub fn replica_from_user_agent(user_agent: &str) -> Option<&str> {
    let rest = user_agent.trim().strip_prefix("catalogsync/")?;
    let open = rest.find('(')?;
    let close = rest.rfind(')')?;
    let identity = rest.get(open + 1..close)?.trim();
    (!identity.is_empty()).then_some(identity)
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    stage: String,
    verb: String,
    user: RawUser,
    user_agent: Option<String>,
    object_ref: Option<RawObjectRef>,
    response_status: Option<RawStatus>,
    response_object: Option<serde_json::Value>,
    request_received_timestamp: String,
    stage_timestamp: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawUser {
    username: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawObjectRef {
    resource: String,
    namespace: Option<String>,
    name: Option<String>,
    api_group: Option<String>,
    subresource: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawStatus {
    code: u16,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawLease {
    kind: String,
    metadata: RawMeta,
    spec: RawLeaseSpec,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct RawMeta {
    name: Option<String>,
    namespace: Option<String>,
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct RawLeaseSpec {
    holder_identity: Option<String>,
    renew_time: Option<String>,
    acquire_time: Option<String>,
    lease_duration_seconds: Option<i64>,
}

impl RawEvent {
    fn code(&self) -> u16 {
        self.response_status.as_ref().map_or(0, |s| s.code)
    }

    /// The event that closes a request: `ResponseComplete`, or `Panic`.
    fn is_final(&self) -> bool {
        matches!(self.stage.as_str(), "ResponseComplete" | "Panic")
    }
}

/// The complete lines of an audit log text (a last line without its newline is being
/// written right now and skipped).
fn complete_lines(text: &str) -> impl Iterator<Item = &str> {
    let complete = text.rfind('\n').map_or("", |end| &text[..end]);
    complete.lines().filter(|line| !line.trim().is_empty())
}

fn parse_time(text: &str, what: &str) -> Result<Timestamp> {
    Timestamp::from_str(text).with_context(|| format!("invalid {what} {text:?}"))
}

/// The successful Lease writes (group `coordination.k8s.io`; verbs create, update, patch,
/// delete; 2xx) in a KCP audit log text, ordered by `requestReceivedTimestamp`.
///
/// # Errors
/// Fails when a complete line that mentions `leases` is not an audit event, or a timestamp
/// is invalid.
pub fn parse_lease_writes(text: &str) -> Result<Vec<LeaseWrite>> {
    let mut writes = Vec::new();
    for line in complete_lines(text).filter(|line| line.contains("\"leases\"")) {
        let event: RawEvent =
            serde_json::from_str(line).with_context(|| format!("failed to parse an audit event: {line}"))?;
        let Some(object) = event.object_ref.as_ref() else { continue };
        let is_lease = object.resource == "leases"
            && object.api_group.as_deref() == Some("coordination.k8s.io")
            && object.subresource.is_none();
        let verb_ok = matches!(event.verb.as_str(), "create" | "update" | "patch" | "delete");
        if !is_lease || !verb_ok || !event.is_final() || !(200..300).contains(&event.code()) {
            continue;
        }
        let lease: RawLease = event
            .response_object
            .clone()
            .filter(|o| o.get("kind").and_then(serde_json::Value::as_str) == Some("Lease"))
            .map(serde_json::from_value)
            .transpose()
            .with_context(|| format!("failed to parse the Lease in an audit event: {line}"))?
            .unwrap_or_default();
        let deleted = event.verb == "delete";
        let name = lease.metadata.name.or_else(|| object.name.clone()).unwrap_or_default();
        let namespace = lease.metadata.namespace.or_else(|| object.namespace.clone()).unwrap_or_default();
        let spec = lease.spec;
        let optional_time =
            |t: &Option<String>, what: &str| t.as_deref().filter(|t| !t.is_empty()).map(|t| parse_time(t, what));
        writes.push(LeaseWrite {
            time: parse_time(&event.request_received_timestamp, "requestReceivedTimestamp")?,
            verb: event.verb.clone(),
            code: event.code(),
            user: event.user.username.clone(),
            namespace,
            name,
            deleted,
            holder: if deleted { String::new() } else { spec.holder_identity.clone().unwrap_or_default() },
            renew_time: optional_time(&spec.renew_time, "renewTime").transpose()?,
            acquire_time: optional_time(&spec.acquire_time, "acquireTime").transpose()?,
            lease_duration_seconds: spec.lease_duration_seconds,
            annotations: lease.metadata.annotations,
        });
    }
    writes.sort_by_key(|w| w.time);
    Ok(writes)
}

/// The write requests (create, update, patch, delete, deletecollection; any response code)
/// in an SKR audit log text, each from its `requestReceivedTimestamp` to the `stageTimestamp`
/// of its closing event, ordered by `requestReceivedTimestamp`; `skr` names the log.
///
/// # Errors
/// Fails when a complete line is not an audit event or a timestamp is invalid.
pub fn parse_skr_writes(text: &str, skr: &str) -> Result<Vec<SkrWrite>> {
    let mut writes = Vec::new();
    let mut seen = BTreeSet::new();
    for line in complete_lines(text) {
        let event: RawEvent =
            serde_json::from_str(line).with_context(|| format!("failed to parse an audit event: {line}"))?;
        let is_write = matches!(event.verb.as_str(), "create" | "update" | "patch" | "delete" | "deletecollection");
        if !is_write || !event.is_final() || !seen.insert(event.audit_id.clone()) {
            continue;
        }
        let target = event.object_ref.as_ref().map_or_else(String::new, |o| {
            let resource = match &o.subresource {
                Some(sub) => format!("{}/{sub}", o.resource),
                None => o.resource.clone(),
            };
            format!("{resource} {}/{}", o.namespace.as_deref().unwrap_or(""), o.name.as_deref().unwrap_or(""))
        });
        let user_agent = event.user_agent.clone().unwrap_or_default();
        let time = parse_time(&event.request_received_timestamp, "requestReceivedTimestamp")?;
        writes.push(SkrWrite {
            time,
            completed: parse_time(&event.stage_timestamp, "stageTimestamp")?.max(time),
            user: event.user.username.clone(),
            replica: replica_from_user_agent(&user_agent).map(str::to_owned),
            user_agent,
            verb: event.verb.clone(),
            code: event.code(),
            target,
            audit_id: event.audit_id.clone(),
            skr: skr.to_owned(),
        });
    }
    writes.sort_by_key(|w| w.time);
    Ok(writes)
}

fn read_log(path: &Path) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
        Err(e) => Err(e).with_context(|| format!("failed to read the audit log {}", path.display())),
    }
}

/// [`parse_lease_writes`] of the audit log at `path` (empty when it does not exist).
///
/// # Errors
/// Fails when the file cannot be read or parsed.
pub fn read_lease_writes(path: &Path) -> Result<Vec<LeaseWrite>> {
    parse_lease_writes(&read_log(path)?).with_context(|| format!("in {}", path.display()))
}

/// [`parse_skr_writes`] of the audit log at `path`, named after its directory.
///
/// # Errors
/// Fails when the file cannot be read or parsed.
pub fn read_skr_writes(path: &Path) -> Result<Vec<SkrWrite>> {
    let skr = path
        .parent()
        .and_then(Path::file_name)
        .map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
    parse_skr_writes(&read_log(path)?, &skr).with_context(|| format!("in {}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// Timelines

/// One point of a shard's holder timeline: a successful write of its Lease.
#[derive(Clone, Debug, PartialEq)]
pub struct HolderChange {
    /// `requestReceivedTimestamp` of the write.
    pub time: Timestamp,
    /// The holder from then on ("" = unheld).
    pub holder: String,
    /// The verb of the write.
    pub verb: String,
    /// Who wrote it.
    pub user: String,
    /// The Lease's annotations after the write (e.g. the coordinator's desired holder).
    pub annotations: BTreeMap<String, String>,
}

/// The holder timeline of each shard Lease (in `namespace`, or in any namespace), ordered by
/// time. Every successful write is a point, also those that keep the holder.
pub fn shard_timelines(writes: &[LeaseWrite], namespace: Option<&str>) -> BTreeMap<u32, Vec<HolderChange>> {
    let mut timelines: BTreeMap<u32, Vec<HolderChange>> = BTreeMap::new();
    for w in writes.iter().filter(|w| namespace.is_none_or(|ns| w.namespace == ns)) {
        if let Some(shard) = w.shard() {
            timelines.entry(shard).or_default().push(HolderChange {
                time: w.time,
                holder: w.holder.clone(),
                verb: w.verb.clone(),
                user: w.user.clone(),
                annotations: w.annotations.clone(),
            });
        }
    }
    for timeline in timelines.values_mut() {
        timeline.sort_by_key(|c| c.time);
    }
    timelines
}

/// The holders of a timeline in order, consecutive repeats collapsed: e.g. `["a", "", "b"]`.
pub fn holder_sequence(timeline: &[HolderChange]) -> Vec<String> {
    let mut sequence: Vec<String> = Vec::new();
    for change in timeline {
        if sequence.last() != Some(&change.holder) {
            sequence.push(change.holder.clone());
        }
    }
    sequence
}

/// The last point of `timeline` at or before `t`.
pub fn holder_at(timeline: &[HolderChange], t: Timestamp) -> Option<&HolderChange> {
    let after = timeline.partition_point(|c| c.time <= t);
    after.checked_sub(1).map(|i| &timeline[i])
}

/// The first point of `timeline` in `(from, to]` whose holder is not `holder`: where a
/// tenure of `holder` that covers `from` ends before `to`.
pub fn holder_change_within<'a>(
    timeline: &'a [HolderChange],
    holder: &str,
    from: Timestamp,
    to: Timestamp,
) -> Option<&'a HolderChange> {
    let start = timeline.partition_point(|c| c.time <= from);
    timeline[start..].iter().take_while(|c| c.time <= to).find(|c| c.holder != holder)
}

/// Liveness of each member (by the identity in its Lease name): `(write time, live until)`.
type Members = BTreeMap<String, Vec<(Timestamp, Option<Timestamp>)>>;

fn member_histories(writes: &[LeaseWrite], namespace: Option<&str>) -> Members {
    let mut members: Members = BTreeMap::new();
    for w in writes.iter().filter(|w| namespace.is_none_or(|ns| w.namespace == ns)) {
        if let Some(identity) = w.member() {
            members.entry(identity.to_owned()).or_default().push((w.time, w.live_until()));
        }
    }
    for history in members.values_mut() {
        history.sort_by_key(|(t, _)| *t);
    }
    members
}

fn member_live(members: &Members, identity: &str, t: Timestamp) -> bool {
    let Some(history) = members.get(identity) else { return false };
    let after = history.partition_point(|(written, _)| *written <= t);
    after.checked_sub(1).and_then(|i| history[i].1).is_some_and(|until| t <= until)
}

/// Whether the member Lease of `identity` was live at every instant of `[from, to]`: the
/// write in force at `from` and every later one up to `to` each keep it live until the next
/// one (or until `to`).
fn member_live_over(members: &Members, identity: &str, from: Timestamp, to: Timestamp) -> bool {
    let Some(history) = members.get(identity) else { return false };
    let Some(first) = history.partition_point(|(written, _)| *written <= from).checked_sub(1) else { return false };
    let last = history.partition_point(|(written, _)| *written <= to);
    (first..last).all(|i| {
        let segment_end = history.get(i + 1).map_or(to, |(next, _)| (*next).min(to));
        history[i].1.is_some_and(|until| segment_end <= until)
    })
}

// ---------------------------------------------------------------------------------------------
// The check

/// Options of [`analyze`].
#[derive(Clone, Debug, Default)]
pub struct InvariantOptions {
    /// Only Leases in this namespace (tests share the KCP; set it to the test's lease namespace).
    pub lease_namespace: Option<String>,
    /// Count a shard as unowned also while its holder's member Lease is expired, released,
    /// deleted or was never written; and report writes by a holder whose member Lease was not
    /// live as fencing violations.
    pub member_liveness: bool,
    /// Unowned windows are counted from here (default: each shard Lease's first write).
    pub from: Option<Timestamp>,
    /// ... up to here (default: the last Lease or SKR write seen).
    pub until: Option<Timestamp>,
}

/// What to check: audit log paths and the shard of each SKR user.
#[derive(Clone, Debug, Default)]
pub struct InvariantInput {
    /// The KCP audit log (Lease history).
    pub kcp_audit_log: PathBuf,
    /// The SKR audit logs.
    pub skr_audit_logs: Vec<PathBuf>,
    /// Shard of each SKR user name (a Kyma's client identity); writes of other users are
    /// not checked.
    pub shard_of_user: BTreeMap<String, u32>,
    /// Options.
    pub options: InvariantOptions,
}

/// The longest unowned window of a shard.
#[derive(Clone, Debug, PartialEq)]
pub struct UnownedWindow {
    /// Start.
    pub start: Timestamp,
    /// End.
    pub end: Timestamp,
    /// `end - start`.
    pub duration: Duration,
}

/// The outcome of [`analyze`] / [`check_invariants`].
#[derive(Clone, Debug, Default)]
pub struct InvariantReport {
    /// Double-writer violations: SKR writes by a replica that did not hold the shard for the
    /// whole of the write, from received to completed (including writes no replica can be
    /// told from: no catalogsync User-Agent, or a shard whose Lease was never written), and
    /// pairs of writes as one SKR user by different replicas whose intervals overlap. Empty
    /// when the invariant held.
    pub violations: Vec<String>,
    /// With [`InvariantOptions::member_liveness`]: writes by the shard holder while its own
    /// member Lease was not live at some point of the write (it should have fenced itself).
    pub fencing_violations: Vec<String>,
    /// The longest unowned window over all shards (zero when none).
    pub longest_unowned: Duration,
    /// The shard of [`InvariantReport::longest_unowned`] (`None` when it is zero).
    pub longest_unowned_shard: Option<u32>,
    /// The longest unowned window of each shard that had one.
    pub unowned_per_shard: BTreeMap<u32, UnownedWindow>,
    /// The replicas that wrote as each SKR user (`?<user agent>` when not a catalogsync one).
    pub writers_per_user: BTreeMap<String, BTreeSet<String>>,
    /// SKR users written by more than one replica overall (informational: a handover moves
    /// a Kyma legitimately).
    pub multi_writer_users: Vec<String>,
    /// The holder timeline of each shard.
    pub timelines: BTreeMap<u32, Vec<HolderChange>>,
    /// SKR writes checked (by users in the shard map).
    pub skr_writes_checked: usize,
    /// The longest checked SKR write, from received to completed.
    pub longest_skr_write: Duration,
    /// The least time from a write's completion to the end of its writer's tenure of the
    /// shard (the next Lease write naming another holder), over the writes whose writer held
    /// the shard throughout: how close a predecessor's writes came to its successor.
    pub closest_to_handover: Option<Duration>,
    /// SKR writes ignored (other users, e.g. the test's admin).
    pub skr_writes_ignored: usize,
    /// Lease writes seen (all namespaces and names).
    pub lease_writes: usize,
}

impl InvariantReport {
    /// Holders of `shard` in order, repeats collapsed (see [`holder_sequence`]).
    pub fn holder_sequence(&self, shard: u32) -> Vec<String> {
        self.timelines.get(&shard).map(|t| holder_sequence(t)).unwrap_or_default()
    }

    /// Whether there are neither violations nor fencing violations.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty() && self.fencing_violations.is_empty()
    }

    /// Panics with the report unless [`InvariantReport::violations`] is empty.
    ///
    /// # Panics
    /// On any double-writer violation.
    pub fn assert_no_double_writer(&self) {
        assert!(self.violations.is_empty(), "one writer per SKR violated:\n{self}");
    }
}

fn fmt_duration(d: Duration) -> String {
    format!("{:.3}s", d.as_secs_f64())
}

impl fmt::Display for InvariantReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let replicas: BTreeSet<&String> = self.writers_per_user.values().flatten().collect();
        writeln!(
            f,
            "invariants: {} SKR writes by {} writer(s) for {} SKR user(s) checked against {} shard timeline(s) \
             ({} Lease writes; {} other SKR writes ignored)",
            self.skr_writes_checked,
            replicas.len(),
            self.writers_per_user.len(),
            self.timelines.len(),
            self.lease_writes,
            self.skr_writes_ignored,
        )?;
        writeln!(
            f,
            "  double-writer violations: {}; fencing violations: {}",
            self.violations.len(),
            self.fencing_violations.len()
        )?;
        let closest = self.closest_to_handover.map_or_else(|| "none".to_owned(), fmt_duration);
        writeln!(
            f,
            "  longest SKR write: {}; closest write end before its writer's tenure ended: {closest}",
            fmt_duration(self.longest_skr_write)
        )?;
        match (self.longest_unowned_shard, self.longest_unowned_shard.and_then(|s| self.unowned_per_shard.get(&s))) {
            (Some(shard), Some(w)) => writeln!(
                f,
                "  longest unowned window: {} (shard {shard}, {} .. {})",
                fmt_duration(self.longest_unowned),
                w.start,
                w.end
            )?,
            _ => writeln!(f, "  longest unowned window: none")?,
        }
        if !self.multi_writer_users.is_empty() {
            write!(f, "  SKR users with more than one writer: {}", self.multi_writer_users.len())?;
            for user in self.multi_writer_users.iter().take(3) {
                write!(f, "; {user}: {:?}", self.writers_per_user.get(user).cloned().unwrap_or_default())?;
            }
            writeln!(f)?;
        }
        for (title, list) in [("violations", &self.violations), ("fencing violations", &self.fencing_violations)] {
            if !list.is_empty() {
                writeln!(f, "  {title} (first {} of {}):", list.len().min(SHOWN), list.len())?;
                for v in list.iter().take(SHOWN) {
                    writeln!(f, "    - {v}")?;
                }
            }
        }
        Ok(())
    }
}

/// Checks the invariants on parsed audit data (see the module docs).
pub fn analyze(
    lease_writes: &[LeaseWrite],
    skr_writes: &[SkrWrite],
    shard_of_user: &BTreeMap<String, u32>,
    options: &InvariantOptions,
) -> InvariantReport {
    let ns = options.lease_namespace.as_deref();
    let timelines = shard_timelines(lease_writes, ns);
    let members = member_histories(lease_writes, ns);
    let mut report = InvariantReport { lease_writes: lease_writes.len(), ..InvariantReport::default() };
    // The checked writes with a replica identity, per SKR user: (shard, write, replica).
    let mut by_user: BTreeMap<&str, Vec<(u32, &SkrWrite, &String)>> = BTreeMap::new();

    for w in skr_writes {
        let Some(&shard) = shard_of_user.get(&w.user) else {
            report.skr_writes_ignored += 1;
            continue;
        };
        report.skr_writes_checked += 1;
        let duration = Duration::try_from(w.completed.duration_since(w.time)).unwrap_or_default();
        report.longest_skr_write = report.longest_skr_write.max(duration);
        let writer = w.replica.clone().unwrap_or_else(|| format!("?{}", w.user_agent));
        report.writers_per_user.entry(w.user.clone()).or_default().insert(writer.clone());
        let what = describe_write(shard, w, &writer);
        let Some(replica) = &w.replica else {
            report.violations.push(format!("{what}: no replica identity in User-Agent {:?}", w.user_agent));
            continue;
        };
        by_user.entry(&w.user).or_default().push((shard, w, replica));
        let timeline = timelines.get(&shard).map_or(&[][..], Vec::as_slice);
        match holder_at(timeline, w.time) {
            None => report.violations.push(format!("{what}: the shard Lease had not been written yet")),
            Some(h) if h.holder != *replica => report
                .violations
                .push(format!("{what}: holder then {:?} (since {}, {} by {})", h.holder, h.time, h.verb, h.user)),
            Some(_) => {
                if let Some(next) = holder_change_within(timeline, replica, w.time, w.completed) {
                    report.violations.push(format!(
                        "{what}: still in flight when the holder became {:?} ({}, {} by {})",
                        next.holder, next.time, next.verb, next.user
                    ));
                } else if options.member_liveness && !member_live_over(&members, replica, w.time, w.completed) {
                    report.fencing_violations.push(format!("{what}: holder, but its member Lease was not live"));
                }
                if let Some(next) = holder_change_within(timeline, replica, w.completed, Timestamp::MAX) {
                    let margin = Duration::try_from(next.time.duration_since(w.completed)).unwrap_or_default();
                    report.closest_to_handover = Some(report.closest_to_handover.map_or(margin, |m| m.min(margin)));
                }
            }
        }
    }
    for writes in by_user.values_mut() {
        report.violations.extend(overlapping_writers(writes));
    }
    report.multi_writer_users =
        report.writers_per_user.iter().filter(|(_, writers)| writers.len() > 1).map(|(u, _)| u.clone()).collect();

    let last_seen = lease_writes.iter().map(|w| w.time).chain(skr_writes.iter().map(|w| w.completed)).max();
    if let Some(until) = options.until.or(last_seen) {
        for (&shard, timeline) in &timelines {
            if let Some(window) = longest_unowned(timeline, &members, options, until) {
                if window.duration > report.longest_unowned {
                    report.longest_unowned = window.duration;
                    report.longest_unowned_shard = Some(shard);
                }
                report.unowned_per_shard.insert(shard, window);
            }
        }
    }
    report.timelines = timelines;
    report
}

/// How a violation names an SKR write.
fn describe_write(shard: u32, w: &SkrWrite, writer: &str) -> String {
    format!(
        "shard {shard}: {} {} in {} as {} by replica {writer:?} from {} to {} (HTTP {})",
        w.verb, w.target, w.skr, w.user, w.time, w.completed, w.code
    )
}

/// The pairs among the writes of one SKR user, by different replicas, whose intervals
/// `[received, completed]` overlap (intervals that only touch do not). One violation per pair.
/// Pairs of writes (as one SKR user; shard, write, replica) by different replicas whose
/// intervals overlap, described; writes that only touch do not overlap.
pub fn overlapping_writers(writes: &mut [(u32, &SkrWrite, &String)]) -> Vec<String> {
    writes.sort_by_key(|(_, w, _)| (w.time, w.completed));
    let mut found = Vec::new();
    // Earlier writes that may still overlap a later one: those completed after its receipt.
    let mut open: Vec<(u32, &SkrWrite, &String)> = Vec::new();
    for &(shard, w, replica) in writes.iter() {
        open.retain(|(_, earlier, _)| earlier.completed > w.time);
        for (earlier_shard, earlier, earlier_replica) in &open {
            if *earlier_replica != replica {
                found.push(format!(
                    "{}: overlaps a write by replica {replica:?}: {}",
                    describe_write(*earlier_shard, earlier, earlier_replica),
                    describe_write(shard, w, replica),
                ));
            }
        }
        open.push((shard, w, replica));
    }
    found
}

/// The longest window in `[max(first write, from), until]` in which the shard was unowned.
fn longest_unowned(
    timeline: &[HolderChange],
    members: &Members,
    options: &InvariantOptions,
    until: Timestamp,
) -> Option<UnownedWindow> {
    let first = timeline.first()?.time;
    let start = options.from.map_or(first, |from| from.max(first));
    if start >= until {
        return None;
    }
    let owned = |t: Timestamp| {
        holder_at(timeline, t)
            .is_some_and(|h| !h.holder.is_empty() && (!options.member_liveness || member_live(members, &h.holder, t)))
    };
    // The state is constant between breakpoints: Lease writes and member expiries.
    let mut points: Vec<Timestamp> = vec![start, until];
    points.extend(timeline.iter().map(|c| c.time));
    if options.member_liveness {
        for history in members.values() {
            for (written, live_until) in history {
                points.push(*written);
                points.extend(live_until.filter(|t| *t != Timestamp::MAX));
            }
        }
    }
    points.retain(|t| (start..=until).contains(t));
    points.sort();
    points.dedup();

    fn close(open: &mut Option<Timestamp>, end: Timestamp, best: &mut Option<UnownedWindow>) {
        if let Some(begin) = open.take() {
            let duration = Duration::try_from(end.duration_since(begin)).unwrap_or_default();
            if best.as_ref().is_none_or(|b| duration > b.duration) {
                *best = Some(UnownedWindow { start: begin, end, duration });
            }
        }
    }
    let mut best: Option<UnownedWindow> = None;
    let mut open: Option<Timestamp> = None;
    for pair in points.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        let mid = a.checked_add(b.duration_since(a) / 2).unwrap_or(a);
        if owned(mid) {
            close(&mut open, a, &mut best);
        } else if open.is_none() {
            open = Some(a);
        }
    }
    close(&mut open, until, &mut best);
    best.filter(|w| !w.duration.is_zero())
}

/// Reads the audit logs of `input` and [`analyze`]s them.
///
/// # Errors
/// Fails when a log cannot be read or parsed.
pub fn check_invariants(input: &InvariantInput) -> Result<InvariantReport> {
    let lease_writes = read_lease_writes(&input.kcp_audit_log)?;
    let mut skr_writes = Vec::new();
    for path in &input.skr_audit_logs {
        skr_writes.extend(read_skr_writes(path)?);
    }
    skr_writes.sort_by_key(|w| w.time);
    Ok(analyze(&lease_writes, &skr_writes, &input.shard_of_user, &input.options))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NS: &str = "leases-ns";

    fn ts(seconds: f64) -> String {
        let micros = (seconds * 1e6).round() as i64;
        Timestamp::from_microsecond(1_767_225_600_000_000 + micros).expect("a valid time").to_string()
    }

    fn at(seconds: f64) -> Timestamp {
        ts(seconds).parse().expect("a valid time")
    }

    /// A Lease write event received at `t` seconds with `holder`, completed 0.3 s later.
    fn lease_line(verb: &str, name: &str, holder: Option<&str>, t: f64, code: u16, renew: Option<f64>) -> String {
        let mut spec = json!({"leaseDurationSeconds": 6});
        if let Some(holder) = holder {
            spec["holderIdentity"] = json!(holder);
        }
        if let Some(renew) = renew {
            spec["renewTime"] = json!(ts(renew));
        }
        json!({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "RequestResponse",
            "auditID": format!("lease-{name}-{t}"), "stage": "ResponseComplete", "verb": verb,
            "requestURI": format!("/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{name}"),
            "user": {"username": "system:serviceaccount:catalogsync-system:catalogsync"},
            "userAgent": "catalogsync/0.1.0 (whoever)",
            "objectRef": {"resource": "leases", "namespace": NS, "name": name, "apiGroup": "coordination.k8s.io", "apiVersion": "v1"},
            "responseStatus": {"metadata": {}, "code": code},
            "responseObject": {
                "kind": "Lease", "apiVersion": "coordination.k8s.io/v1",
                "metadata": {"name": name, "namespace": NS, "annotations": {"catalogsync.kyma-project.io/desired": "x"}},
                "spec": spec,
            },
            "requestReceivedTimestamp": ts(t), "stageTimestamp": ts(t + 0.3),
        })
        .to_string()
    }

    /// An SKR write by `user` with `user_agent` received at `t` seconds, completed 2 ms later.
    fn skr_line(verb: &str, user: &str, user_agent: &str, t: f64, code: u16) -> String {
        skr_span(verb, user, user_agent, t, t + 0.002, code)
    }

    /// An SKR write by `user` with `user_agent` received at `t` and completed at `done` seconds.
    fn skr_span(verb: &str, user: &str, user_agent: &str, t: f64, done: f64, code: u16) -> String {
        json!({
            "kind": "Event", "apiVersion": "audit.k8s.io/v1", "level": "Metadata",
            "auditID": format!("skr-{user}-{t}"), "stage": "ResponseComplete", "verb": verb,
            "requestURI": "/apis/operator.kyma-project.io/v1beta2/namespaces/kyma-system/moduletemplates/m-1",
            "user": {"username": user, "groups": ["system:masters", "system:authenticated"]},
            "userAgent": user_agent,
            "objectRef": {"resource": "moduletemplates", "namespace": "kyma-system", "name": "m-1", "apiGroup": "operator.kyma-project.io"},
            "responseStatus": {"metadata": {}, "code": code},
            "requestReceivedTimestamp": ts(t), "stageTimestamp": ts(done),
        })
        .to_string()
    }

    fn lines(lines: &[String]) -> String {
        lines.iter().map(|l| format!("{l}\n")).collect()
    }

    fn shards(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(u, s)| ((*u).to_owned(), *s)).collect()
    }

    fn options() -> InvariantOptions {
        InvariantOptions { lease_namespace: Some(NS.to_owned()), ..InvariantOptions::default() }
    }

    fn run(kcp: &[String], skr: &[String], map: &BTreeMap<String, u32>, options: &InvariantOptions) -> InvariantReport {
        let leases = parse_lease_writes(&lines(kcp)).expect("parse leases");
        let writes = parse_skr_writes(&lines(skr), "skr-a").expect("parse skr writes");
        analyze(&leases, &writes, map, options)
    }

    #[test]
    fn user_agent_identity() {
        assert_eq!(replica_from_user_agent("catalogsync/0.1.0 (replica-0)"), Some("replica-0"));
        assert_eq!(replica_from_user_agent("catalogsync/1.2.3-dev (pod-7f9c (canary))"), Some("pod-7f9c (canary)"));
        assert_eq!(replica_from_user_agent(" catalogsync/0.1.0 ( r1 ) "), Some("r1"));
        assert_eq!(replica_from_user_agent("catalogsync/0.1.0"), None);
        assert_eq!(replica_from_user_agent("catalogsync/0.1.0 ()"), None);
        assert_eq!(replica_from_user_agent("kubectl/v1.35.4 (linux/amd64) kubernetes/abc"), None);
        assert_eq!(replica_from_user_agent(""), None);
    }

    #[test]
    fn parses_lease_bodies_and_skips_failures_and_other_resources() {
        let kcp = lines(&[
            lease_line("create", "catalogsync-shard-3", Some("a"), 1.0, 201, Some(1.0)),
            lease_line("update", "catalogsync-shard-3", Some("b"), 2.0, 409, Some(2.0)), // conflict: not a write
            lease_line("patch", "catalogsync-member-a", Some("a"), 3.0, 200, Some(2.5)),
            lease_line("get", "catalogsync-shard-3", Some("a"), 4.0, 200, None),
            r#"{"auditID":"x","stage":"ResponseComplete","verb":"create","objectRef":{"resource":"configmaps"},"stageTimestamp":"2026-01-01T00:00:00Z"}"#.to_owned(),
        ]) + r#"{"half a line"#;
        let writes = parse_lease_writes(&kcp).expect("parse");
        assert_eq!(writes.len(), 2, "{writes:#?}");
        assert_eq!(writes[0].shard(), Some(3));
        assert_eq!(writes[0].holder, "a");
        assert_eq!(writes[0].code, 201);
        assert_eq!(writes[0].time, at(1.0));
        assert_eq!(writes[0].annotations.get("catalogsync.kyma-project.io/desired").map(String::as_str), Some("x"));
        assert_eq!(writes[1].member(), Some("a"));
        assert_eq!(writes[1].renew_time, Some(at(2.5)));
        assert_eq!(writes[1].lease_duration_seconds, Some(6));
        assert_eq!(writes[1].live_until(), Some(at(8.5)));
    }

    #[test]
    fn no_violation_when_every_write_is_by_the_holder() {
        let kcp = [
            lease_line("create", "catalogsync-shard-0", Some("a"), 1.0, 201, Some(1.0)),
            lease_line("update", "catalogsync-shard-0", Some(""), 5.0, 200, None),
            lease_line("update", "catalogsync-shard-0", Some("b"), 5.5, 200, Some(5.5)),
            lease_line("create", "catalogsync-shard-1", Some("b"), 1.0, 201, Some(1.0)),
        ];
        let skr = [
            skr_line("patch", "kyma-0", "catalogsync/0.1.0 (a)", 2.0, 200),
            skr_line("patch", "kyma-0", "catalogsync/0.1.0 (a)", 4.9, 500), // failed, still a's
            skr_line("delete", "kyma-0", "catalogsync/0.1.0 (b)", 6.0, 404),
            skr_line("create", "kyma-1", "catalogsync/0.1.0 (b)", 2.0, 201),
            skr_line("get", "kyma-1", "catalogsync/0.1.0 (a)", 2.0, 200), // a read: not checked
            skr_line("patch", "admin", "kubectl/v1.35.4", 3.0, 200),      // not in the map
        ];
        let report = run(&kcp, &skr, &shards(&[("kyma-0", 0), ("kyma-1", 1)]), &options());
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!(report.skr_writes_checked, 4);
        assert_eq!(report.skr_writes_ignored, 1);
        assert_eq!(report.holder_sequence(0), ["a", "", "b"]);
        let writers: Vec<&str> = report.writers_per_user["kyma-0"].iter().map(String::as_str).collect();
        assert_eq!(writers, ["a", "b"]);
        assert_eq!(report.multi_writer_users, ["kyma-0"]);
        assert!(report.to_string().contains("double-writer violations: 0"), "{report}");
    }

    #[test]
    fn write_after_release_is_a_violation() {
        let kcp = [
            lease_line("create", "catalogsync-shard-2", Some("a"), 1.0, 201, Some(1.0)),
            lease_line("update", "catalogsync-shard-2", Some(""), 5.0, 200, None),
            lease_line("update", "catalogsync-shard-2", Some("b"), 6.0, 200, Some(6.0)),
        ];
        let skr = [
            skr_line("patch", "kyma-7", "catalogsync/0.1.0 (a)", 4.0, 200),
            skr_line("patch", "kyma-7", "catalogsync/0.1.0 (a)", 5.2, 200), // released at 5.0
            skr_line("patch", "kyma-7", "catalogsync/0.1.0 (a)", 7.0, 409), // b holds it
            skr_line("patch", "kyma-7", "kube-rs", 7.5, 200),               // nobody can tell who
            skr_line("patch", "kyma-7", "catalogsync/0.1.0 (b)", 0.5, 200), // before any Lease
        ];
        let report = run(&kcp, &skr, &shards(&[("kyma-7", 2)]), &options());
        assert_eq!(report.violations.len(), 4, "{report}");
        assert!(report.violations[1].contains("shard 2") && report.violations[1].contains("holder then \"\""));
        assert!(report.violations[2].contains("holder then \"b\""), "{}", report.violations[2]);
        assert!(report.violations[3].contains("no replica identity"), "{}", report.violations[3]);
        assert!(report.violations[0].contains("not been written yet"), "{}", report.violations[0]);
        let shown = report.to_string();
        assert!(shown.contains("double-writer violations: 4"), "{shown}");
        assert!(std::panic::catch_unwind(|| report.assert_no_double_writer()).is_err());
    }

    #[test]
    fn a_claim_counts_from_when_it_was_received() {
        // The claim completes at 2.3 s by its stageTimestamp; the claimer had the response
        // and wrote to the SKR before that (seen in CI on a loaded machine).
        let kcp = [
            lease_line("create", "catalogsync-shard-1", Some(""), 1.0, 201, None),
            lease_line("update", "catalogsync-shard-1", Some("b"), 2.0, 200, Some(2.0)),
        ];
        let skr = [
            skr_line("patch", "kyma-3", "catalogsync/0.1.0 (b)", 2.1, 200),
            skr_line("patch", "kyma-3", "catalogsync/0.1.0 (b)", 1.9, 200), // before its claim
        ];
        let report = run(&kcp, &skr, &shards(&[("kyma-3", 1)]), &options());
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("holder then \"\""), "{}", report.violations[0]);
    }

    #[test]
    fn skr_writes_span_from_received_to_completed() {
        let skr = [
            skr_span("patch", "kyma-0", "catalogsync/0.1.0 (a)", 2.0, 2.75, 200),
            // A clock step cannot make a write end before it began.
            skr_span("delete", "kyma-0", "catalogsync/0.1.0 (a)", 3.0, 2.5, 200),
        ];
        let writes = parse_skr_writes(&lines(&skr), "skr-a").expect("parse");
        assert_eq!((writes[0].time, writes[0].completed), (at(2.0), at(2.75)));
        assert_eq!((writes[1].time, writes[1].completed), (at(3.0), at(3.0)));
    }

    #[test]
    fn a_write_still_in_flight_after_the_shard_moved_is_a_violation() {
        // a holds shard 0 until 5.0 (released), b claims it at 5.5.
        let kcp = [
            lease_line("create", "catalogsync-shard-0", Some("a"), 1.0, 201, Some(1.0)),
            lease_line("update", "catalogsync-shard-0", Some("a"), 3.0, 200, Some(3.0)), // keeps a
            lease_line("update", "catalogsync-shard-0", Some(""), 5.0, 200, None),
            lease_line("update", "catalogsync-shard-0", Some("b"), 5.5, 200, Some(5.5)),
        ];
        let map = shards(&[("kyma-0", 0)]);
        // Received while a held the shard, done after b claimed it: its start alone looks fine.
        let late = [skr_span("patch", "kyma-0", "catalogsync/0.1.0 (a)", 4.8, 5.6, 200)];
        let report = run(&kcp, &late, &map, &options());
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("still in flight when the holder became \"\""), "{report}");
        // Across a write that keeps the holder: fine.
        let across = [skr_span("patch", "kyma-0", "catalogsync/0.1.0 (a)", 2.5, 3.5, 200)];
        assert!(run(&kcp, &across, &map, &options()).violations.is_empty());
        // Begun before its claim, done after it: a violation too.
        let early = [skr_span("patch", "kyma-0", "catalogsync/0.1.0 (b)", 5.4, 5.7, 200)];
        let report = run(&kcp, &early, &map, &options());
        assert_eq!(report.violations.len(), 1, "{report}");
        assert!(report.violations[0].contains("holder then \"\""), "{report}");
    }

    #[test]
    fn overlapping_writes_by_two_replicas_are_a_violation() {
        // No Lease history can excuse two replicas writing as one SKR user at once. (The
        // shard timeline alone would flag one of them as well; the pair names both.)
        let kcp = [
            lease_line("create", "catalogsync-shard-0", Some("a"), 1.0, 201, Some(1.0)),
            lease_line("update", "catalogsync-shard-0", Some("b"), 3.0, 200, Some(3.0)),
        ];
        let skr = [
            skr_span("patch", "kyma-0", "catalogsync/0.1.0 (a)", 2.0, 2.9, 200),
            skr_span("patch", "kyma-0", "catalogsync/0.1.0 (b)", 2.8, 3.2, 200),
            skr_span("patch", "kyma-1", "catalogsync/0.1.0 (b)", 2.0, 2.9, 200), // another SKR user
        ];
        let report = run(&kcp, &skr, &shards(&[("kyma-0", 0), ("kyma-1", 0)]), &options());
        let pairs: Vec<&String> = report.violations.iter().filter(|v| v.contains("overlaps a write")).collect();
        assert_eq!(pairs.len(), 1, "{report}");
        assert!(pairs[0].contains("replica \"a\"") && pairs[0].contains("replica \"b\""), "{report}");
        assert!(pairs[0].contains("as kyma-0"), "{report}");
        // Overlapping writes by one replica are its own concurrency, not a second writer.
        let own = [
            skr_span("patch", "kyma-0", "catalogsync/0.1.0 (a)", 1.5, 2.5, 200),
            skr_span("delete", "kyma-0", "catalogsync/0.1.0 (a)", 1.6, 2.4, 200),
        ];
        assert!(run(&kcp, &own, &shards(&[("kyma-0", 0)]), &options()).violations.is_empty());
    }

    #[test]
    fn back_to_back_writes_by_two_replicas_are_fine() {
        // a's last write ends before it releases; b's first write begins after its claim.
        let kcp = [
            lease_line("create", "catalogsync-shard-0", Some("a"), 1.0, 201, Some(1.0)),
            lease_line("update", "catalogsync-shard-0", Some(""), 3.0, 200, None),
            lease_line("update", "catalogsync-shard-0", Some("b"), 3.1, 200, Some(3.1)),
        ];
        let skr = [
            skr_span("patch", "kyma-0", "catalogsync/0.1.0 (a)", 2.0, 2.99, 200),
            skr_span("patch", "kyma-0", "catalogsync/0.1.0 (b)", 3.1, 3.4, 200),
            skr_span("patch", "kyma-0", "catalogsync/0.1.0 (b)", 3.4, 3.5, 200), // touches: no overlap
        ];
        let report = run(&kcp, &skr, &shards(&[("kyma-0", 0)]), &options());
        assert!(report.violations.is_empty(), "{report}");
        assert_eq!(report.skr_writes_checked, 3);
        assert_eq!(report.longest_skr_write, Duration::from_millis(990));
        assert_eq!(
            report.closest_to_handover,
            Some(Duration::from_millis(10)),
            "a's write ended 10 ms before its release"
        );
        // Without Leases in between, touching intervals of two replicas are still no overlap.
        let skr = [
            skr_span("patch", "kyma-0", "catalogsync/0.1.0 (a)", 2.0, 2.5, 200),
            skr_span("patch", "kyma-0", "catalogsync/0.1.0 (b)", 2.5, 2.6, 200),
        ];
        let writes = parse_skr_writes(&lines(&skr), "skr-a").expect("parse");
        let mut refs: Vec<(u32, &SkrWrite, &String)> =
            writes.iter().map(|w| (0, w, w.replica.as_ref().expect("an identity"))).collect();
        assert!(overlapping_writers(&mut refs).is_empty());
    }

    #[test]
    fn member_liveness_covers_the_whole_write() {
        // a's member Lease (6 s) is renewed at 1 (live until 7) and at 8 (a gap 7 .. 8).
        let kcp = [
            lease_line("create", "catalogsync-member-a", Some("a"), 1.0, 201, Some(1.0)),
            lease_line("create", "catalogsync-shard-0", Some("a"), 1.0, 201, Some(1.0)),
            lease_line("update", "catalogsync-member-a", Some("a"), 8.0, 200, Some(8.0)),
        ];
        let map = shards(&[("kyma-0", 0)]);
        let opts = InvariantOptions { member_liveness: true, ..options() };
        let inside = [skr_span("patch", "kyma-0", "catalogsync/0.1.0 (a)", 5.0, 6.9, 200)];
        assert!(run(&kcp, &inside, &map, &opts).is_clean());
        let past_expiry = [skr_span("patch", "kyma-0", "catalogsync/0.1.0 (a)", 6.5, 7.2, 200)];
        assert_eq!(run(&kcp, &past_expiry, &map, &opts).fencing_violations.len(), 1);
        let across_gap = [skr_span("patch", "kyma-0", "catalogsync/0.1.0 (a)", 6.5, 8.5, 200)];
        assert_eq!(run(&kcp, &across_gap, &map, &opts).fencing_violations.len(), 1);
        let after_renewal = [skr_span("patch", "kyma-0", "catalogsync/0.1.0 (a)", 8.0, 8.5, 200)];
        assert!(run(&kcp, &after_renewal, &map, &opts).is_clean());
    }

    #[test]
    fn leases_of_other_namespaces_do_not_count() {
        let mut other = lease_line("create", "catalogsync-shard-0", Some("a"), 1.0, 201, None);
        other = other.replace(NS, "elsewhere");
        let skr = [skr_line("patch", "kyma-0", "catalogsync/0.1.0 (a)", 2.0, 200)];
        let report = run(&[other], &skr, &shards(&[("kyma-0", 0)]), &options());
        assert_eq!(report.violations.len(), 1, "{report}");
    }

    #[test]
    fn unowned_windows_from_empty_holders() {
        let kcp = [
            lease_line("create", "catalogsync-shard-0", Some(""), 0.0, 201, None), // unowned 0..1
            lease_line("update", "catalogsync-shard-0", Some("a"), 1.0, 200, Some(1.0)),
            lease_line("update", "catalogsync-shard-0", Some(""), 3.0, 200, None), // unowned 3..6.5
            lease_line("update", "catalogsync-shard-0", Some(""), 4.0, 200, None),
            lease_line("update", "catalogsync-shard-0", Some("b"), 6.5, 200, Some(6.5)),
            lease_line("create", "catalogsync-shard-1", Some("b"), 0.0, 201, Some(0.0)),
            lease_line("update", "catalogsync-shard-1", Some(""), 9.0, 200, None), // unowned 9..10 (until)
        ];
        let mut opts = options();
        opts.until = Some(at(10.0));
        let report = run(&kcp, &[], &BTreeMap::new(), &opts);
        assert_eq!(report.longest_unowned, Duration::from_millis(3500), "{report}");
        assert_eq!(report.longest_unowned_shard, Some(0));
        assert_eq!(report.unowned_per_shard[&0].start, at(3.0));
        assert_eq!(report.unowned_per_shard[&0].end, at(6.5));
        assert_eq!(report.unowned_per_shard[&1].duration, Duration::from_secs(1));
        assert!(report.to_string().contains("longest unowned window: 3.500s (shard 0"), "{report}");

        // Counting only from 5 s on: shard 0 is unowned 5..6.5, shard 1 9..10.
        opts.from = Some(at(5.0));
        let report = run(&kcp, &[], &BTreeMap::new(), &opts);
        assert_eq!(report.longest_unowned, Duration::from_millis(1500), "{report}");

        // A shard held from its creation on has no unowned window.
        let report = run(&kcp[5..6], &[], &BTreeMap::new(), &options());
        assert_eq!(report.longest_unowned, Duration::ZERO);
        assert_eq!(report.longest_unowned_shard, None);
        assert!(report.to_string().contains("longest unowned window: none"), "{report}");
    }

    #[test]
    fn unowned_while_the_holders_member_lease_is_expired() {
        // a holds shard 0 from 1 s on; its member Lease (6 s) is renewed at 1 and 3 (live
        // until 9), then a dies; the coordinator hands the shard to b at 12.
        let kcp = [
            lease_line("create", "catalogsync-member-a", Some("a"), 1.0, 201, Some(1.0)),
            lease_line("create", "catalogsync-shard-0", Some("a"), 1.0, 201, Some(1.0)),
            lease_line("update", "catalogsync-member-a", Some("a"), 3.0, 200, Some(3.0)),
            lease_line("create", "catalogsync-member-b", Some("b"), 2.0, 201, Some(2.0)),
            lease_line("update", "catalogsync-member-b", Some("b"), 8.0, 200, Some(8.0)),
            lease_line("update", "catalogsync-member-b", Some("b"), 13.0, 200, Some(13.0)),
            lease_line("update", "catalogsync-shard-0", Some("b"), 12.0, 200, Some(12.0)),
        ];
        let skr = [
            skr_line("patch", "kyma-0", "catalogsync/0.1.0 (a)", 8.5, 200), // a still live
            skr_line("patch", "kyma-0", "catalogsync/0.1.0 (a)", 10.0, 200), // holder, but expired
            skr_line("patch", "kyma-0", "catalogsync/0.1.0 (b)", 12.5, 200),
        ];
        let mut opts = options();
        opts.until = Some(at(15.0));
        let without = run(&kcp, &skr, &shards(&[("kyma-0", 0)]), &opts);
        assert_eq!(without.longest_unowned, Duration::ZERO, "{without}");
        assert!(without.is_clean(), "{without}");

        opts.member_liveness = true;
        let with = run(&kcp, &skr, &shards(&[("kyma-0", 0)]), &opts);
        assert_eq!(with.longest_unowned, Duration::from_secs(3), "{with}"); // 9 .. 12
        assert_eq!(with.unowned_per_shard[&0].start, at(9.0));
        assert!(with.violations.is_empty(), "{with}");
        assert_eq!(with.fencing_violations.len(), 1, "{with}");
        assert!(with.fencing_violations[0].contains("member Lease was not live"), "{with}");
    }
}
