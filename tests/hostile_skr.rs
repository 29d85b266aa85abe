//! SKRs that lie in one place only, each attack tried for real (docs/operations.md,
//! "Security model"): catalogsync runs as a process against the real KCP and SKR apiservers,
//! and a forwarding front ([`SkrFront`]) passes an attacked Kyma's requests to a real SKR,
//! answering or rewriting just the ones the attack is about. A healthy Kyma beside the
//! attacked ones must get a catalog change while the attack runs.
//!
//! The attacks: list pages of one item whose name is 7 MiB, for 150 pages; a
//! `resourceVersion` of 1 MiB in list items and in apply answers; in shadow mode, 10,000
//! extra copies with names of 253 characters on one SKR and names that carry a forged log
//! line on another; a list whose `continue` token repeats, and one that grows and never ends.
//!
//! Bounds these tests state and check:
//! - the replica's peak RSS stays under [`RSS_BOUND_MIB`] (the pod's limit is 512 MiB);
//! - no log line is longer than [`LOG_LINE_BOUND`] bytes, and none is forged;
//! - a refused answer fails its own Kyma with a reason that says what was wrong
//!   (`SkrAnswerInvalid` naming the field, `SkrResponseTooLarge`, `SkrBudgetExceeded`),
//!   and its condition quotes no part of the offending value.
#![allow(clippy::panic)] // Test helpers report failures by panicking.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use http::StatusCode;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use serde_json::{Value, json};
use testenv::front::{Answer, Piece, RequestHead, SkrFront, Verdict};
use testenv::scenario::{MRM, MT, Scenario, labelled, mrm, mt};

/// A refusal must show in the condition well within this (a few syncs with backoff, on two
/// cores shared with three apiservers and the other tests' replicas).
const PROMPT: Duration = Duration::from_secs(30);

/// Peak RSS (VmHWM) a replica may reach in these tests, in MiB: as in `tests/security.rs`. An
/// idle replica of the tests is about 20-30 MiB; a single SKR answer is at most 8 MiB.
const RSS_BOUND_MIB: u64 = 150;

/// Longest log line accepted, in bytes: a condition message is at most 1,024 characters and
/// SKR-sent text at most 256.
const LOG_LINE_BOUND: usize = 4096;

/// Longest condition message accepted, in characters: 1,024 and the `...` of a cut.
const CONDITION_BOUND: usize = 1024 + 3;

/// A run of this many identical filler characters in a condition or log line is a quoted
/// piece of an attacker's value.
const QUOTED_RUN: usize = 100;

const MIB: usize = 1024 * 1024;

/// The field manager of catalogsync's copies, spelled out as the SKR sees it.
const SKR_FIELD_MANAGER: &str = "catalog-sync";

/// The label that lets a Kyma see beta ModuleTemplates.
const BETA_LABEL: &str = "operator.kyma-project.io/beta";

fn catalog() -> Vec<Value> {
    vec![mt("api-gateway", "2.10.0"), mrm("api-gateway", &[("regular", "2.10.0")])]
}

/// The catalog change the healthy Kyma must get while an attack runs.
fn change() -> Vec<Value> {
    vec![mt("keda", "1.3.0"), mrm("keda", &[("regular", "1.3.0")])]
}

fn loopback(last: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last])
}

/// Starts a front before `skr` that lets `attack` decide about each request.
fn front(
    last: u8,
    skr: &testenv::ControlPlane,
    attack: impl Fn(&RequestHead) -> Verdict + Send + Sync + 'static,
) -> SkrFront {
    SkrFront::start(loopback(last), skr, attack).expect("start an SKR front")
}

/// Creates Kyma `kyma` whose access Secret points at `front` (with a token the front drops).
async fn add_attacked(s: &Scenario, kyma: &str, front: &SkrFront) {
    s.put_secret(kyma, kyma, &front.kubeconfig_with_token("front-token")).await.expect("secret");
    s.add_kyma_without_secret(kyma, &[]).await.expect("kyma");
}

/// Waits until `kyma`'s `ModuleCatalog` condition is False with one of `reasons`.
///
/// # Panics
/// After `timeout`, naming the condition last seen and the replica's peak RSS.
async fn await_failure(s: &Scenario, kyma: &str, reasons: &[&str], timeout: Duration) -> Condition {
    let deadline = Instant::now() + timeout;
    loop {
        let cond = s.condition(kyma).await;
        if let Some(cond) = cond.as_ref().filter(|c| c.status == "False" && reasons.contains(&c.reason.as_str())) {
            return cond.clone();
        }
        if Instant::now() >= deadline {
            let last = cond.map_or_else(
                || "none".to_owned(),
                |c| format!("{} {}: {}", c.status, c.reason, c.message.chars().take(300).collect::<String>()),
            );
            panic!(
                "timed out after {}s waiting for kyma {kyma} ModuleCatalog=False with a reason in {reasons:?}; \
                 last condition: {last}; peak RSS of the replica {} MiB",
                timeout.as_secs(),
                s.peak_rss_mib()
            );
        }
        tokio::time::sleep(testenv::wait::POLL_INTERVAL).await;
    }
}

/// Asserts that a condition message is bounded, printable and quotes no run of `filler`.
fn assert_quotes_nothing(kyma: &str, message: &str, filler: char) {
    assert!(message.chars().count() <= CONDITION_BOUND, "{kyma}: a condition message of {} chars", message.len());
    assert!(!message.chars().any(char::is_control), "{kyma}: control characters in {message:?}");
    let run = filler.to_string().repeat(QUOTED_RUN);
    assert!(!message.contains(&run), "{kyma}: the condition quotes the SKR's value: {message}");
}

/// Applies [`change`] and waits until the healthy Kyma's SKR (`skr_a`) holds it.
async fn healthy_gets_a_change(s: &Scenario) {
    let env = testenv::env();
    let started = Instant::now();
    s.apply_catalog(&change()).await.expect("change");
    s.await_skr_names(&env.skr_a, MT, &["api-gateway-2.10.0", "keda-1.3.0"], PROMPT).await;
    s.await_skr_names(&env.skr_a, MRM, &["api-gateway", "keda"], PROMPT).await;
    eprintln!("a catalog change reached the healthy SKR in {:.1}s", started.elapsed().as_secs_f64());
}

/// Waits until `count` reaches `at_least` (the front saw that many more syncs).
async fn await_count(what: &str, count: impl Fn() -> usize, at_least: usize) {
    testenv::await_condition(PROMPT, &format!("{what} to reach {at_least}"), || async { count() >= at_least }).await;
}

/// The checks every test ends with: peak RSS under the bound, short log lines, a replica
/// still running.
fn assert_bounded(s: &mut Scenario, what: &str) {
    let rss = s.peak_rss_mib();
    eprintln!("{what}: peak RSS of the replica {rss} MiB");
    assert!(rss < RSS_BOUND_MIB, "{what}: peak RSS {rss} MiB (bound {RSS_BOUND_MIB} MiB)");
    let long = s.long_log_lines(LOG_LINE_BOUND);
    assert!(long.is_empty(), "{what}: log lines over {LOG_LINE_BOUND} bytes: {long:?}");
    assert!(s.catalogsync_running(), "{what}: catalogsync exited");
}

// --- Lists the front makes up -----------------------------------------------------------

/// A ModuleTemplate as a list holds it: in full (a `ModuleTemplate` with a small spec) or,
/// for a metadata-only list, as `PartialObjectMetadata`. Managed by catalogsync when
/// `managed`.
fn mt_item(head: &RequestHead, name: &str, managed: bool, annotation: &str) -> Value {
    let mut metadata = json!({
        "name": name,
        "uid": format!("uid-{:016x}", fnv1a(name.as_bytes())),
        "resourceVersion": "1",
        "annotations": {"front": annotation},
    });
    if managed {
        metadata["managedFields"] = json!([{"manager": SKR_FIELD_MANAGER, "operation": "Apply",
            "apiVersion": "operator.kyma-project.io/v1beta2", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}}]);
    }
    if head.is_metadata_only() {
        json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": metadata})
    } else {
        json!({"apiVersion": "operator.kyma-project.io/v1beta2", "kind": "ModuleTemplate", "metadata": metadata,
               "spec": {"channel": "regular", "data": {"kind": "Sample"}}})
    }
}

/// FNV-1a of `bytes`: a distinct-enough uid per name, without a dependency.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// A list page of `items` with `next` as its `continue` token, shaped as `head` asked for.
fn list_page(head: &RequestHead, items: Vec<Value>, next: Option<String>) -> Value {
    let (api_version, kind) = if head.is_metadata_only() {
        ("meta.k8s.io/v1", "PartialObjectMetadataList")
    } else {
        ("operator.kyma-project.io/v1beta2", "ModuleTemplateList")
    };
    let mut metadata = json!({"resourceVersion": "1"});
    if let Some(next) = next {
        metadata["continue"] = json!(next);
    }
    json!({"apiVersion": api_version, "kind": kind, "metadata": metadata, "items": items})
}

/// The page a list request asks for: 1 without a `continue` token, else the number after
/// `<prefix>-` in it.
fn page_number(head: &RequestHead, prefix: &str) -> usize {
    head.continue_token().and_then(|t| t.strip_prefix(prefix)?.strip_prefix('-')?.parse().ok()).unwrap_or(1)
}

fn page_token(prefix: &str, page: usize) -> String {
    format!("{prefix}-{page}")
}

/// The page size a list request asks for (`limit`), at most `most`: a page larger than asked
/// for is itself a lie, which these lists leave to the attack they are about.
fn page_size(head: &RequestHead, most: usize) -> usize {
    head.query_param("limit").and_then(|l| l.parse().ok()).filter(|l| *l > 0).map_or(most, |l: usize| l.min(most))
}

// --- (a) Paged huge names ----------------------------------------------------------------

/// The name of each item of [`huge_name_page`]: 7 MiB, under the 8 MiB answer limit with
/// the page around it.
const HUGE_NAME: usize = 7 * MIB;

/// Pages of the huge-name list: 150 x 7 MiB is about 1 GiB.
const HUGE_PAGES: usize = 150;

/// The filler of a huge name.
const NAME_FILLER: u8 = b'q';

/// A list page of one unmanaged ModuleTemplate whose name is [`HUGE_NAME`] filler bytes,
/// generated while sent, with `next` as its `continue` token.
fn huge_name_page(head: &RequestHead, next: Option<String>) -> Answer {
    const SLOT: &str = "HUGE-NAME-SLOT";
    let page = list_page(head, vec![mt_item(head, SLOT, false, "huge-name")], next).to_string();
    let (before, after) = page.split_once(SLOT).expect("the slot is in the page");
    let (before, after) = (before.to_owned(), after.to_owned());
    Answer::pieces(StatusCode::OK, vec![Piece::text(before), Piece::fill(NAME_FILLER, HUGE_NAME), Piece::text(after)])
}

/// Pages of one item with a 7 MiB name, each with a fresh `continue` token, 150 of them: on
/// the code before the fix a sync held every page's name at once (1,175 MiB, measured by a
/// user). The replica must refuse the name at decode, name the field without quoting it,
/// stay far under the pod's limit, and keep syncing the healthy Kyma.
#[tokio::test]
async fn paged_huge_names_cost_a_bounded_amount_and_fail_only_their_kyma() {
    let env = testenv::env();
    let deepest = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&deepest);
    let front = front(21, &env.skr_b, move |head| {
        if !head.is_list_of(MT) {
            return Verdict::Forward;
        }
        let page = page_number(head, "huge");
        seen.fetch_max(page, Ordering::SeqCst);
        let next = (page < HUGE_PAGES).then(|| page_token("huge", page + 1));
        Verdict::Answer(huge_name_page(head, next))
    });
    let mut s = Scenario::new("hostile-names").await.expect("scenario");
    s.apply_catalog(&catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("healthy kyma");
    add_attacked(&s, "huge-names", &front).await;
    let started = Instant::now();
    s.start(&[]).expect("start");

    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    let cond = await_failure(&s, "huge-names", &["SkrAnswerInvalid"], PROMPT).await;
    eprintln!(
        "huge-names: SkrAnswerInvalid after {:.1}s, deepest page {}, {} MiB answered: {}",
        started.elapsed().as_secs_f64(),
        deepest.load(Ordering::SeqCst),
        front.answered_bytes() >> 20,
        cond.message
    );
    assert!(cond.message.contains("metadata.name"), "the condition does not name the field: {}", cond.message);
    assert_quotes_nothing("huge-names", &cond.message, char::from(NAME_FILLER));

    // The healthy Kyma gets a change while the attacked one keeps retrying (and failing).
    let lists = front.answered();
    healthy_gets_a_change(&s).await;
    await_count("MT lists answered by the front", || front.answered(), lists + 2).await;
    assert!(s.condition("healthy").await.is_some_and(|c| c.status == "True"), "the healthy Kyma is not synced");
    let cond = await_failure(&s, "huge-names", &["SkrAnswerInvalid"], PROMPT).await;
    assert_quotes_nothing("huge-names", &cond.message, char::from(NAME_FILLER));

    let deepest = deepest.load(Ordering::SeqCst);
    assert!(deepest < HUGE_PAGES, "a sync read all {HUGE_PAGES} pages of {} MiB names", HUGE_NAME >> 20);
    assert_bounded(&mut s, "paged huge names");
    let quoted = char::from(NAME_FILLER).to_string().repeat(QUOTED_RUN);
    assert!(!s.log().contains(&quoted), "the log quotes a huge name");
}

// --- (b) Long resourceVersions -----------------------------------------------------------

/// The `resourceVersion` the fronts put into answers: 1 MiB.
const LONG_RV: usize = MIB;

/// Its filler.
const RV_FILLER: char = '9';

/// Sets `metadata.resourceVersion` of `object` to a [`LONG_RV`] string.
fn lengthen_rv(object: &mut Value) {
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        metadata.insert("resourceVersion".to_owned(), json!(RV_FILLER.to_string().repeat(LONG_RV)));
    }
}

fn is_catalog_list(head: &RequestHead) -> bool {
    head.is_list_of(MT) || head.is_list_of(MRM)
}

fn is_catalog_apply(head: &RequestHead) -> bool {
    head.is_apply_to(MT) || head.is_apply_to(MRM)
}

/// A `resourceVersion` of 1 MiB: in every item of the catalog lists of one SKR, and in the
/// answers to the applies of another (whose lists the front empties, so that every sync
/// applies again). Both Kymas fail with `SkrAnswerInvalid` naming `resourceVersion`, and
/// after several syncs the replica has kept none of it: its peak RSS stays under the bound,
/// and so does the figure it exports for what it remembers of each SKR, if it exports one.
#[tokio::test]
async fn long_resource_versions_are_refused_and_nothing_is_kept() {
    let env = testenv::env();
    let in_lists = front(22, &env.skr_b, |head| {
        if is_catalog_list(head) {
            Verdict::rewrite(|_, list: &mut Value| {
                for item in list.get_mut("items").and_then(Value::as_array_mut).into_iter().flatten() {
                    lengthen_rv(item);
                }
            })
        } else {
            Verdict::Forward
        }
    });
    let in_applies = front(23, &env.skr_b, |head| {
        if is_catalog_list(head) {
            Verdict::rewrite(|_, list: &mut Value| list["items"] = json!([]))
        } else if is_catalog_apply(head) {
            Verdict::rewrite(|_, object: &mut Value| lengthen_rv(object))
        } else {
            Verdict::Forward
        }
    });
    let mut s = Scenario::new("hostile-rv").await.expect("scenario");
    s.apply_catalog(&catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("healthy kyma");
    add_attacked(&s, "long-rv-lists", &in_lists).await;
    add_attacked(&s, "long-rv-applies", &in_applies).await;
    let started = Instant::now();
    // A short resync, so warm SKRs list again soon: the lists hold items only once some
    // sync has applied the copies into the SKR behind the fronts.
    s.start(&["--resync-period", "3s"]).expect("start");

    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    for kyma in ["long-rv-lists", "long-rv-applies"] {
        let cond = await_failure(&s, kyma, &["SkrAnswerInvalid"], 2 * PROMPT).await;
        eprintln!("{kyma}: SkrAnswerInvalid after {:.1}s: {}", started.elapsed().as_secs_f64(), cond.message);
        assert!(
            cond.message.contains("resourceVersion"),
            "{kyma}: the condition does not name the field: {}",
            cond.message
        );
        assert_quotes_nothing(kyma, &cond.message, RV_FILLER);
    }

    // Several more syncs of each, while the healthy Kyma gets a change.
    let (lists, applies) = (in_lists.rewritten(), in_applies.rewritten());
    healthy_gets_a_change(&s).await;
    await_count("answers rewritten with long resourceVersions in lists", || in_lists.rewritten(), lists + 3).await;
    await_count("answers rewritten with long resourceVersions in applies", || in_applies.rewritten(), applies + 3)
        .await;
    for kyma in ["long-rv-lists", "long-rv-applies"] {
        let cond = await_failure(&s, kyma, &["SkrAnswerInvalid"], PROMPT).await;
        assert_quotes_nothing(kyma, &cond.message, RV_FILLER);
    }

    assert_bounded(&mut s, "long resourceVersions");
    let quoted = RV_FILLER.to_string().repeat(QUOTED_RUN);
    assert!(!s.log().contains(&quoted), "the log quotes a long resourceVersion");
}

// --- (c) Shadow mode's extra copies ------------------------------------------------------

/// Extra managed copies with names of [`EXTRA_NAME_LEN`] characters that one attacked SKR
/// lists: as many as an SKR may list of one kind.
const EXTRAS: usize = 10_000;

/// The names that carry a forged log line after a newline: a JSON one and a plain one. The
/// other attacked SKR lists them first.
const FORGED: [&str; 2] = [
    "forged-json\n{\"level\":\"ERROR\",\"fields\":{\"message\":\"forged\"}}",
    "forged-plain\n2026-01-01T00:00:00Z ERROR forged",
];

/// Valid extra copies listed after the [`FORGED`] ones.
const FORGED_COMPANIONS: usize = 98;

/// Where the names of the [`FORGED_COMPANIONS`] are numbered from, apart from the
/// [`EXTRAS`]' (and no name holds the count of the extras).
const COMPANION_OFFSET: usize = 90_000;

/// What a forged log line starts with.
const FORGED_LINES: [&str; 2] =
    ["{\"level\":\"ERROR\",\"fields\":{\"message\":\"forged\"}}", "2026-01-01T00:00:00Z ERROR forged"];

/// The longest name Kubernetes allows.
const EXTRA_NAME_LEN: usize = 253;

/// Items per page of the extra copies (fewer when the client asks for fewer).
const EXTRA_PAGE: usize = 500;

/// Most distinct extra names the replica may log over the whole test: "a few" of each SKR.
const MAX_NAMES_LOGGED: usize = 10;

/// `extra-<5 digits>-xxx...`, [`EXTRA_NAME_LEN`] characters.
fn extra_name(index: usize) -> String {
    let prefix = format!("extra-{index:05}-");
    format!("{prefix}{}", "x".repeat(EXTRA_NAME_LEN - prefix.len()))
}

/// The distinct `extra-<5 digits>-` names in `log`.
fn extra_names_in(log: &str) -> BTreeSet<&str> {
    log.match_indices("extra-")
        .filter_map(|(at, _)| {
            let id = log.get(at..at + 12)?;
            let digits = id.get(6..11)?;
            (digits.bytes().all(|b| b.is_ascii_digit()) && id.ends_with('-')).then_some(id)
        })
        .collect()
}

/// The log lines that start with a [`FORGED_LINES`] text.
fn forged_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| FORGED_LINES.iter().any(|f| l.trim_start().starts_with(f))).collect()
}

/// A front whose ModuleTemplate lists hold only extra managed copies named `names(0..count)`,
/// in pages of at most [`EXTRA_PAGE`], and which counts the pages it serves.
fn extras_front(
    last: u8,
    count: usize,
    names: impl Fn(usize) -> String + Send + Sync + 'static,
) -> (SkrFront, Arc<AtomicUsize>) {
    let served = Arc::new(AtomicUsize::new(0));
    let pages = Arc::clone(&served);
    let front = front(last, &testenv::env().skr_b, move |head| {
        if !head.is_list_of(MT) {
            return Verdict::Forward;
        }
        // The token says where the next page starts, so pages of any size follow on.
        let start = page_number(head, "extras") - 1;
        let end = (start + page_size(head, EXTRA_PAGE)).min(count);
        let items = (start..end).map(|i| mt_item(head, &names(i), true, "extra")).collect();
        let next = (end < count).then(|| page_token("extras", end + 1));
        pages.fetch_add(1, Ordering::SeqCst);
        Verdict::Answer(Answer::json(StatusCode::OK, &list_page(head, items, next)))
    });
    (front, served)
}

/// How the replica took the SKR whose extra copies carry forged log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ForgedVerdict {
    /// It compared and reports them (as counts).
    Reported,
    /// It refused the list (names with newlines are not valid names).
    Refused,
}

/// One shadow-mode run in log format `format`, with two attacked Kymas: `extras`, whose
/// SKR lists [`EXTRAS`] extra copies, and `forged`, whose SKR lists the [`FORGED`] ones and
/// [`FORGED_COMPANIONS`].
async fn shadow_attack(format: &str, first_address: u8) {
    const OBJECTS: &str = "catalogsync_shadow_objects";
    let env = testenv::env();
    let (extras, extra_pages) = extras_front(first_address, EXTRAS, extra_name);
    let forged_count = FORGED.len() + FORGED_COMPANIONS;
    let names = |i: usize| FORGED.get(i).map_or_else(|| extra_name(COMPANION_OFFSET + i), |f| (*f).to_owned());
    let (forged, forged_pages) = extras_front(first_address + 1, forged_count, names);
    let mut s = Scenario::new(&format!("hostile-shadow-{format}")).await.expect("scenario");
    s.apply_catalog(&catalog()).await.expect("catalog");
    // Beta, so that a beta module added later is desired for it alone.
    s.add_kyma("healthy", &env.skr_a, &[(BETA_LABEL, "true")]).await.expect("healthy kyma");
    add_attacked(&s, "extras", &extras).await;
    add_attacked(&s, "forged", &forged).await;
    let started = Instant::now();
    s.start(&["--mode", "shadow", "--resync-period", "3s", "--log-format", format]).expect("start");

    let what = format!("shadow mode, {format} log");
    let extra_mts = [r#"kind="ModuleTemplate""#, r#"difference="extra""#];
    let all_reported = (EXTRAS + forged_count) as f64;
    let verdict = testenv::await_condition(
        2 * PROMPT,
        &format!("{what}: {EXTRAS} extra copies reported, and those with forged log lines reported or refused"),
        || async {
            let extra = s.metric(OBJECTS, &extra_mts).await;
            let refused = s.metric("catalogsync_sync_errors_total", &[r#"reason="SkrAnswerInvalid""#]).await;
            match (extra >= all_reported, extra >= EXTRAS as f64 && refused > 0.0) {
                (true, _) => Some(ForgedVerdict::Reported),
                (false, true) => Some(ForgedVerdict::Refused),
                (false, false) => None,
            }
        },
    )
    .await;
    let log = s.log();
    eprintln!(
        "{what}: extras reported, forged {verdict:?} after {:.1}s ({} and {} pages served); \
         {} distinct extra names in {} bytes of log",
        started.elapsed().as_secs_f64(),
        extra_pages.load(Ordering::SeqCst),
        forged_pages.load(Ordering::SeqCst),
        extra_names_in(&log).len(),
        log.len()
    );
    let forged_lines_seen = forged_lines(&log);
    assert!(forged_lines_seen.is_empty(), "{what}: forged log lines: {forged_lines_seen:?}");
    let long = s.long_log_lines(LOG_LINE_BOUND);
    assert!(long.is_empty(), "{what}: log lines over {LOG_LINE_BOUND} bytes: {long:?}");
    let count = EXTRAS.to_string();
    let reported =
        log.lines().any(|l| l.contains("Shadow: the SKR does not hold the desired catalog") && l.contains(&count));
    assert!(reported, "{what}: no shadow line reports the count {count} of extra copies");
    let named = extra_names_in(&log);
    assert!(named.len() <= MAX_NAMES_LOGGED, "{what}: {} extra names logged, not a few", named.len());

    // The healthy Kyma's comparison sees a change: a beta module, desired for it alone.
    let disagreeing = if verdict == ForgedVerdict::Reported { 3.0 } else { 2.0 };
    let disagree = [r#"agreement="disagree""#];
    testenv::await_condition(PROMPT, &format!("{what}: {disagreeing} SKRs in disagreement"), || async {
        s.metric("catalogsync_shadow_skrs", &disagree).await == disagreeing
    })
    .await;
    let missing = |kind: &'static str| {
        let s = &s;
        async move { s.metric(OBJECTS, &[&format!(r#"kind="{kind}""#), r#"difference="missing""#]).await }
    };
    let before = (missing("ModuleTemplate").await, missing("ModuleReleaseMeta").await);
    let beta = labelled(mt("keda", "1.3.0"), BETA_LABEL, "true");
    s.apply_catalog(&[beta, mrm("keda", &[("regular", "1.3.0")])]).await.expect("change");
    testenv::await_condition(PROMPT, &format!("{what}: the healthy Kyma's comparison to see the change"), || async {
        (missing("ModuleTemplate").await, missing("ModuleReleaseMeta").await) == (before.0 + 1.0, before.1 + 1.0)
    })
    .await;

    let log = s.log();
    let forged_lines_seen = forged_lines(&log);
    assert!(forged_lines_seen.is_empty(), "{what}: forged log lines: {forged_lines_seen:?}");
    assert!(extra_names_in(&log).len() <= MAX_NAMES_LOGGED, "{what}: more extra names logged since");
    assert_bounded(&mut s, &what);
}

/// Shadow mode against an SKR with 10,000 extra managed copies of 253-character names, and
/// one whose extra copies start with two names that carry a forged log line after a newline
/// (a JSON one and a plain one), all listed in pages of up to 500: in plain and in JSON log
/// format, no log line is forged or longer than 4 KiB; the 10,000 are reported as a count
/// plus at most a few names; the forged ones are reported so too, or (as names with newlines
/// are not valid names) their list is refused with `SkrAnswerInvalid`; the healthy Kyma's
/// comparison sees a catalog change.
#[tokio::test]
async fn shadow_mode_reports_extra_objects_as_counts_and_a_few_sanitised_names() {
    tokio::join!(shadow_attack("plain", 24), shadow_attack("json", 26));
}

// --- (d) Pagination that never ends ------------------------------------------------------

/// Bytes added to each item of each page of the growing list: the items of page n carry an
/// annotation of n times this many bytes, so the pages grow, each within the `limit` asked for.
const GROWTH: usize = 2 * 1024;

/// Items per page of the growing list (fewer when the client asks for fewer).
const GROWING_PAGE: usize = 500;

/// Two lists that never end: one whose `continue` token repeats (a loop: each page one small
/// valid item and the same token), one whose pages of small valid items (as many as asked
/// for) grow, each item a little larger than on the page before, and always come with a
/// fresh token. The first fails with `SkrAnswerInvalid`, the second with
/// `SkrResponseTooLarge` or `SkrBudgetExceeded`; the replica's RSS stays bounded and the
/// healthy Kyma keeps syncing.
#[tokio::test]
async fn a_growing_or_looping_pagination_fails_the_sync() {
    let env = testenv::env();
    let looped = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&looped);
    let looping = front(28, &env.skr_b, move |head| {
        if !head.is_list_of(MT) {
            return Verdict::Forward;
        }
        count.fetch_add(1, Ordering::SeqCst);
        let page = list_page(head, vec![mt_item(head, "loop-1.0.0", false, "loop")], Some("loop".to_owned()));
        Verdict::Answer(Answer::json(StatusCode::OK, &page))
    });
    let deepest = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&deepest);
    let growing = front(29, &env.skr_b, move |head| {
        if !head.is_list_of(MT) {
            return Verdict::Forward;
        }
        let page = page_number(head, "grow");
        seen.fetch_max(page, Ordering::SeqCst);
        let annotation = "g".repeat(page * GROWTH);
        let items = (0..page_size(head, GROWING_PAGE))
            .map(|i| mt_item(head, &format!("grow-{page:05}-{i:04}"), false, &annotation))
            .collect();
        let page = list_page(head, items, Some(page_token("grow", page + 1)));
        Verdict::Answer(Answer::json(StatusCode::OK, &page))
    });
    let mut s = Scenario::new("hostile-pages").await.expect("scenario");
    s.apply_catalog(&catalog()).await.expect("catalog");
    s.add_kyma("healthy", &env.skr_a, &[]).await.expect("healthy kyma");
    add_attacked(&s, "looping", &looping).await;
    add_attacked(&s, "growing", &growing).await;
    let started = Instant::now();
    s.start(&[]).expect("start");

    s.await_condition("healthy", "True", "CatalogSynced", PROMPT).await;
    let cond = await_failure(&s, "growing", &["SkrResponseTooLarge", "SkrBudgetExceeded"], PROMPT).await;
    eprintln!(
        "growing: {} after {:.1}s, deepest page {}, {} MiB served: {}",
        cond.reason,
        started.elapsed().as_secs_f64(),
        deepest.load(Ordering::SeqCst),
        growing.answered_bytes() >> 20,
        cond.message
    );
    let cond = await_failure(&s, "looping", &["SkrAnswerInvalid"], PROMPT).await;
    eprintln!(
        "looping: SkrAnswerInvalid after {:.1}s, {} pages served: {}",
        started.elapsed().as_secs_f64(),
        looped.load(Ordering::SeqCst),
        cond.message
    );

    let (loops, grows) = (looping.answered(), growing.answered());
    healthy_gets_a_change(&s).await;
    await_count("pages of the looping list", || looping.answered(), loops + 2).await;
    await_count("pages of the growing list", || growing.answered(), grows + 2).await;
    await_failure(&s, "looping", &["SkrAnswerInvalid"], PROMPT).await;
    await_failure(&s, "growing", &["SkrResponseTooLarge", "SkrBudgetExceeded"], PROMPT).await;
    assert_bounded(&mut s, "never-ending pagination");
}
