//! A seeded fuzzer of hostile SKR answers: [`FuzzCase`] draws, from a seed and a case index,
//! which answers of an otherwise honest SKR apiserver are hostile and how; [`FuzzSkr`] is a
//! TLS server on a loopback address that plays that SKR for one case. It writes every answer's
//! bytes by hand (HTTP/1.1 on a tokio-rustls stream), so the framing is exactly what the case
//! says, framing no HTTP library would produce included.
//!
//! ```ignore
//! let tls = FuzzTls::generate()?;                       // one CA for every case
//! let honest = Arc::new(Honest { namespace, crds, copies });
//! let case = FuzzCase::new(seed, 17);
//! let skr = FuzzSkr::start(case.clone(), Arc::clone(&honest), &tls)?;
//! let kubeconfig = skr.kubeconfig_with_token("t0ken");
//! // ... sync against it; on failure print case.description() and skr.fired().
//! ```
//!
//! # The honest SKR
//! Per request, the server answers as an apiserver holding [`Honest`] would: the namespace
//! exists (or, in some cases, is created by the first apply), a CRD GET answers the CRD the
//! test handed over with `Established=True`, full and metadata-only LISTs of both catalog
//! kinds return some of the desired copies as they are plus a few managed orphans and foreign
//! objects, in pages with `continue` tokens; server-side applies answer a
//! `PartialObjectMetadata` with a numeric resourceVersion and manager `catalog-sync` (now and
//! then another manager too, which makes the client read the object back); DELETE answers 200
//! (or 404, gone already).
//!
//! # The hostile answers
//! Each case has one to three triggers: "from request N on, the first request of this class
//! gets this answer", drawn from a catalogue of status codes and Status bodies of every shape,
//! lying or missing Content-Lengths, chunked and trickled bodies, truncated and deeply nested
//! JSON, invalid UTF-8, strings of megabytes in every metadata field, invalid names, wrong
//! kinds and namespaces, odd resourceVersions, connections closed mid-head or mid-body,
//! garbage instead of HTTP, no answer at all, 1xx heads, huge and countless headers. A case
//! may also page its lists in a hostile way: a `continue` token that repeats, pages that grow,
//! a 410 Gone midway, pages that never end. [`FuzzCase::description`] says it all in a line;
//! [`FuzzSkr::fired`] says which hostile answers were actually sent, to which request.
//!
//! A case is a pure function of `(seed, index)`, and each answer a pure function of the case
//! and the request's index (its place in the order of arrival), so a case replays exactly as
//! long as its requests arrive in the same order (a client that sends requests concurrently
//! may order them differently from run to run).
//!
//! # Memory
//! No body is larger than [`MAX_BODY`]. Big strings, big bodies and big heads are kept as a
//! few pieces that repeat a static block, and are cut into pieces of at most [`CHUNK`] bytes
//! only while they are written, so a server holds a few chunks per connection whatever it
//! sends.
//!
//! # Lifetime
//! As [`HostileSkr`](super::hostile::HostileSkr): a thread of its own with its own runtime per
//! server; dropping the [`FuzzSkr`] closes the listener, ends every connection and joins the
//! thread. Several servers (cases) run at once, each on its own port.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, PoisonError};
use std::time::Duration;

use anyhow::{Context as _, Result, ensure};
use catalogsync::api::{MANAGED_BY_LABEL, MANAGED_BY_VALUE, SKR_FIELD_MANAGER};
use futures::FutureExt as _;
use hyper::body::Bytes;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::controlplane::{render_kubeconfig, token_credentials};
use super::hostile::{CHUNK, CONTROL_BLOCK, CONTROL_UNIT, HANDSHAKE_TIMEOUT, PADDING, repeat_block, tls_acceptor};
use super::pki::Pki;

const KIB: usize = 1024;
const MIB: usize = 1024 * KIB;

/// The largest body of any answer: twice `--skr-max-response-size`'s default (8 MiB), so the
/// client's limit is tried from both sides, and small enough that many cases at once stay
/// well within a test machine's memory (bodies are generated while sent anyway).
pub const MAX_BODY: usize = 16 * MIB;

/// The longest huge string: "several MiB", a good part of the client's answer limit.
const MAX_HUGE: usize = 6 * MIB;

/// The lengths a huge string is drawn from: just over a DNS subdomain name (253), a log line's
/// worth, the client's error-body limit (64 KiB), and on to several MiB.
const HUGE_LENGTHS: [usize; 7] = [254, 4 * KIB, 64 * KIB, 512 * KIB, MIB, 3 * MIB, MAX_HUGE];

/// The servers listen on `127.0.0.<ADDRESS_BASE + index % ADDRESS_SPREAD>`: spread over
/// addresses so thousands of short connections do not pile up on one address pair, and away
/// from the low addresses other tests pick by hand.
const ADDRESS_BASE: u8 = 64;
/// See [`ADDRESS_BASE`].
const ADDRESS_SPREAD: u8 = 64;

/// Longest request head read, as Go's `net/http` default (`DefaultMaxHeaderBytes`), which real
/// apiservers use; a longer head is answered 431 and the connection closed.
const MAX_REQUEST_HEAD: usize = MIB;

/// Most of a request body kept (to echo a replaced object); the rest is read and dropped. A
/// copy is at most a few hundred KB.
const MAX_KEPT_BODY: usize = 4 * MIB;

/// How long a connection whose answer announced more than it sent, or that gets no answer at
/// all, is held open for the client to hang up: far past any client timeout a fuzz test uses,
/// so the client always gives up first; bounded so that a forgotten connection still ends.
const HOLD_OPEN: Duration = Duration::from_secs(60);

/// Triggers start at a request index below this: a cold sync of a small catalog sends 10 to
/// 20 requests, a second (warm) sync a few more.
const TRIGGER_SPAN: usize = 24;

/// Most entries [`FuzzSkr::fired`] keeps: enough to explain any case, bounded for the cases
/// whose list never ends.
const MAX_FIRED: usize = 32;

/// The catalog API group and version, in both KCP and SKR.
const CATALOG_API_VERSION: &str = "operator.kyma-project.io/v1beta2";

/// Placeholder strings in a JSON draft that become a lazily generated fill when written.
const FILL_MARK: &str = "@@fuzz-fill-";

/// The honest SKR a case's server plays: what the test hands over of the catalog it syncs.
#[derive(Clone, Debug, Default)]
pub struct Honest {
    /// The sync namespace (`kyma-system`).
    pub namespace: String,
    /// The CRDs by name, as the sync applies them: a GET answers the body with the identity
    /// an apiserver adds and an `Established=True` condition.
    pub crds: BTreeMap<String, Value>,
    /// The desired copies by resource plural (`moduletemplates`, `modulereleasemetas`): lists
    /// hold some of them as they are, and a GET of one answers it.
    pub copies: BTreeMap<String, Vec<Value>>,
}

/// The CA and serving certificate every [`FuzzSkr`] uses: made once per test, since a fresh
/// CA per case costs key generation and proves nothing more.
pub struct FuzzTls {
    ca_pem: String,
    acceptor: TlsAcceptor,
}

impl FuzzTls {
    /// A fresh CA and a serving certificate for every address a case may listen on.
    ///
    /// # Errors
    /// Fails only if the keys or certificates cannot be generated.
    pub fn generate() -> Result<Self> {
        let pki = Pki::generate("fuzz-skr")?;
        let names: Vec<String> = (0..ADDRESS_SPREAD).map(|slot| address(slot).to_string()).collect();
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let acceptor = tls_acceptor(&pki.issue_serving(&names)?)?;
        Ok(Self { ca_pem: pki.ca_pem, acceptor })
    }

    /// The PEM of the CA.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }
}

impl fmt::Debug for FuzzTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FuzzTls").finish_non_exhaustive()
    }
}

fn address(slot: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, ADDRESS_BASE + slot % ADDRESS_SPREAD))
}

/// SplitMix64's finaliser: a well-mixed 64-bit value of `x`.
fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn mix(a: u64, b: u64) -> u64 {
    splitmix(a ^ splitmix(b))
}

// ------------------------------------------------------------------------------------------
// Cases

/// One fuzz case: which answers of the honest SKR are hostile, and how. A pure function of
/// `(seed, index)`.
#[derive(Clone, Debug)]
pub struct FuzzCase {
    seed: u64,
    index: u64,
    key: u64,
    triggers: Vec<Trigger>,
    lists: ListMode,
    shape: Shape,
    syncs: usize,
}

/// What the honest SKR of a case holds and how it answers, when nothing hostile happens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Shape {
    /// Items per list page (the client asks for more; an apiserver may send fewer).
    page_size: usize,
    /// Bit `i`: desired copy `i` of a kind is in the lists, as it is.
    listed: u32,
    /// Orphans (managed by `catalog-sync`, not desired) per kind.
    orphans: usize,
    /// Objects of another manager per kind.
    foreign: usize,
    /// The namespace is missing until applied.
    namespace_missing: bool,
    /// The CRDs are missing until applied.
    crds_missing: bool,
    /// Per mille of apply answers that name another field manager besides `catalog-sync`.
    other_manager: u32,
    /// A copy read back differs from the desired one (so it is replaced).
    drifted: bool,
    /// Per mille of DELETEs answered 404 (gone already).
    gone: u32,
}

/// "From request `at` on, the first request of class `target` gets `hostile`."
#[derive(Clone, Debug)]
struct Trigger {
    at: usize,
    target: Target,
    hostile: Hostile,
}

/// Which requests a trigger waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Target {
    Any,
    List,
    Apply,
}

impl Target {
    fn matches(self, class: &Class) -> bool {
        match self {
            Target::Any => true,
            Target::List => matches!(class, Class::List { .. }),
            Target::Apply => matches!(class, Class::Apply { .. }),
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Target::Any => "any request",
            Target::List => "a list",
            Target::Apply => "an apply",
        })
    }
}

/// How lists are paged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ListMode {
    /// Honestly.
    Honest,
    /// From the second page on, the `continue` token is the one just sent, forever.
    Loops,
    /// Each page has more and bigger items than the one before, and there is always another.
    Grows,
    /// Page `n` (counting from 0) answers 410 Gone (`Expired`); pages before it always have a
    /// next one.
    GoneAt(usize),
    /// Every page has new items and a new token, forever.
    Endless,
    /// Every page is just under the client's answer limit, forever: the sync's byte budget
    /// (or its timeout) must end it.
    Heavy,
}

impl ListMode {
    fn kind(self) -> Option<&'static str> {
        match self {
            ListMode::Honest => None,
            ListMode::Loops => Some("list-loops"),
            ListMode::Grows => Some("list-grows"),
            ListMode::GoneAt(_) => Some("list-gone"),
            ListMode::Endless => Some("list-endless"),
            ListMode::Heavy => Some("list-heavy"),
        }
    }
}

impl fmt::Display for ListMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListMode::Honest => f.write_str("lists paged honestly"),
            ListMode::Loops => f.write_str("lists: the continue token of page 2 on repeats"),
            ListMode::Grows => f.write_str("lists: each page bigger than the last, never the last"),
            ListMode::GoneAt(n) => write!(f, "lists: page {} answers 410 Gone", n + 1),
            ListMode::Endless => f.write_str("lists: new items and a new continue token on every page, forever"),
            ListMode::Heavy => write!(f, "lists: every page {} of new items, forever", size(HEAVY_ITEMS * HEAVY_PAD)),
        }
    }
}

/// One hostile answer.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Hostile {
    /// Status `code` with a body of `shape`.
    Status { code: u16, shape: StatusShape },
    /// The honest body, framed wrongly.
    Framing(Framing),
    /// The honest body cut to `permille` of its bytes, with a matching Content-Length.
    Truncated { permille: u16 },
    /// `depth` nested `open`s (`[` or `{"a":`), closed again or not.
    DeepNesting { depth: usize, arrays: bool, closed: bool },
    /// The honest body with `len` bytes that are not UTF-8 in a name.
    InvalidUtf8 { len: usize },
    /// The honest body with `field` a string of `len` bytes of `fill`.
    HugeField { field: Field, len: usize, fill: Fill },
    /// The honest body with an invalid name.
    BadName(BadName),
    /// The honest body, its items (or itself) of kind `Secret`.
    WrongKind,
    /// The honest body, its items (or itself) in namespace `kube-system`.
    WrongNamespace,
    /// The honest apply answer with an odd resourceVersion.
    OddResourceVersion(OddRv),
    /// `keep` bytes of the honest head, then the connection closes.
    CutHeaders { keep: usize },
    /// The honest head and `permille` of the body, then the connection closes.
    CutBody { permille: u16 },
    /// Not HTTP at all.
    Garbage(Garbage),
    /// Nothing, and the connection stays open.
    Hang,
    /// `count` 1xx heads of `code` first, then the honest answer or a closed connection.
    Informational { code: u16, count: usize, then_close: bool },
    /// The honest answer with one header of `len` bytes.
    HugeHeader { len: usize },
    /// The honest answer with `count` headers.
    ManyHeaders { count: usize },
    /// 200 with an HTML page.
    NotJson,
}

impl Hostile {
    /// A short, bounded label of the kind of answer, for counting.
    fn kind(&self) -> &'static str {
        match self {
            Hostile::Status { .. } => "status",
            Hostile::Framing(_) => "framing",
            Hostile::Truncated { .. } => "truncated-json",
            Hostile::DeepNesting { .. } => "deep-nesting",
            Hostile::InvalidUtf8 { .. } => "invalid-utf8",
            Hostile::HugeField { .. } => "huge-field",
            Hostile::BadName(_) => "bad-name",
            Hostile::WrongKind => "wrong-kind",
            Hostile::WrongNamespace => "wrong-namespace",
            Hostile::OddResourceVersion(_) => "odd-resource-version",
            Hostile::CutHeaders { .. } => "cut-headers",
            Hostile::CutBody { .. } => "cut-body",
            Hostile::Garbage(_) => "garbage",
            Hostile::Hang => "hang",
            Hostile::Informational { .. } => "informational",
            Hostile::HugeHeader { .. } => "huge-header",
            Hostile::ManyHeaders { .. } => "many-headers",
            Hostile::NotJson => "not-json",
        }
    }
}

impl fmt::Display for Hostile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hostile::Status { code, shape } => write!(f, "HTTP {code} with {shape}"),
            Hostile::Framing(framing) => write!(f, "{framing}"),
            Hostile::Truncated { permille } => {
                write!(f, "JSON truncated to {}.{}% of its bytes", permille / 10, permille % 10)
            }
            Hostile::DeepNesting { depth, arrays, closed } => write!(
                f,
                "a body of {depth} nested {}{}",
                if *arrays { "`[`" } else { "`{\"a\":`" },
                if *closed { ", closed again" } else { "" }
            ),
            Hostile::InvalidUtf8 { len } => write!(f, "{len} bytes of invalid UTF-8 in a name"),
            Hostile::HugeField { field, len, fill } => write!(f, "{field} a string of {} of {fill}", size(*len)),
            Hostile::BadName(name) => write!(f, "a name {name}"),
            Hostile::WrongKind => f.write_str("kind Secret (apiVersion v1) instead of the catalog kind"),
            Hostile::WrongNamespace => f.write_str("metadata.namespace kube-system"),
            Hostile::OddResourceVersion(rv) => write!(f, "resourceVersion {rv}"),
            Hostile::CutHeaders { keep } => write!(f, "the connection closed after {keep} bytes of the head"),
            Hostile::CutBody { permille } => {
                write!(f, "the connection closed after {}.{}% of the body", permille / 10, permille % 10)
            }
            Hostile::Garbage(garbage) => write!(f, "{garbage} instead of HTTP"),
            Hostile::Hang => f.write_str("no answer at all, the connection left open"),
            Hostile::Informational { code, count, then_close } => write!(
                f,
                "{count} heads {code} first, then {}",
                if *then_close { "a closed connection" } else { "the answer" }
            ),
            Hostile::HugeHeader { len } => write!(f, "a header of {}", size(*len)),
            Hostile::ManyHeaders { count } => write!(f, "{count} headers"),
            Hostile::NotJson => f.write_str("200 with an HTML page"),
        }
    }
}

/// The body of a hostile status answer.
#[derive(Clone, Debug, PartialEq, Eq)]
enum StatusShape {
    /// A well-formed Status for the code.
    Proper,
    /// No body.
    NoBody,
    /// `{}`.
    EmptyObject,
    /// `{"kind":"Status"}`.
    MissingFields,
    /// A JSON value that is no object.
    NotAnObject(&'static str),
    /// A Status whose fields have the wrong types.
    WrongTypes,
    /// A Status whose message is huge.
    HugeMessage { len: usize, fill: Fill },
    /// A Status whose reason is huge.
    HugeReason { len: usize, fill: Fill },
    /// A Status with `count` details.causes.
    HugeCauses { count: usize },
    /// A Status whose `code` is another.
    CodeDisagrees { code: u16 },
    /// An HTML error page.
    Html,
}

impl fmt::Display for StatusShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatusShape::Proper => f.write_str("a proper Status"),
            StatusShape::NoBody => f.write_str("no body"),
            StatusShape::EmptyObject => f.write_str("body `{}`"),
            StatusShape::MissingFields => f.write_str("a Status of kind only"),
            StatusShape::NotAnObject(body) => write!(f, "body `{body}`"),
            StatusShape::WrongTypes => f.write_str("a Status with fields of the wrong types"),
            StatusShape::HugeMessage { len, fill } => write!(f, "a Status whose message is {} of {fill}", size(*len)),
            StatusShape::HugeReason { len, fill } => write!(f, "a Status whose reason is {} of {fill}", size(*len)),
            StatusShape::HugeCauses { count } => write!(f, "a Status with {count} details.causes"),
            StatusShape::CodeDisagrees { code } => write!(f, "a Status saying code {code}"),
            StatusShape::Html => f.write_str("an HTML page"),
        }
    }
}

/// A wrongly framed honest body.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Framing {
    /// A Content-Length `n` more than the body; the connection stays open.
    LongerLength(usize),
    /// A Content-Length `n` less than the body; the rest follows on the connection.
    ShorterLength(usize),
    /// No length: the body ends with the connection, with a TLS close_notify or without.
    CloseDelimited { abort: bool },
    /// Chunked, in chunks of at most `max` bytes.
    Chunked { max: usize },
    /// Chunked, the first chunk announcing more than it holds.
    ChunkLies,
    /// A few bytes every so often.
    Trickle { bytes: usize, interval_ms: u64, chunked: bool },
    /// Both a Content-Length and chunked.
    LengthAndChunked,
    /// Two Content-Lengths that disagree.
    TwoLengths,
}

impl fmt::Display for Framing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Framing::LongerLength(n) => write!(f, "a Content-Length {n} bytes longer than the body"),
            Framing::ShorterLength(n) => {
                write!(f, "a Content-Length {n} bytes shorter than the body, the rest left on the connection")
            }
            Framing::CloseDelimited { abort: false } => f.write_str("no length, the body ended by close_notify"),
            Framing::CloseDelimited { abort: true } => f.write_str("no length, the body ended by a bare close"),
            Framing::Chunked { max } => write!(f, "a chunked body in chunks of up to {max} bytes"),
            Framing::ChunkLies => f.write_str("a chunk announcing more bytes than it has"),
            Framing::Trickle { bytes, interval_ms, chunked } => write!(
                f,
                "the body trickled, {bytes} bytes every {interval_ms} ms ({})",
                if *chunked { "chunked" } else { "with a Content-Length" }
            ),
            Framing::LengthAndChunked => f.write_str("both a Content-Length and chunked encoding"),
            Framing::TwoLengths => f.write_str("two different Content-Lengths"),
        }
    }
}

/// A metadata field a huge string goes into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Name,
    Namespace,
    Uid,
    ResourceVersion,
    Manager,
    Continue,
    Kind,
    ApiVersion,
    Label,
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Field::Name => "metadata.name",
            Field::Namespace => "metadata.namespace",
            Field::Uid => "metadata.uid",
            Field::ResourceVersion => "metadata.resourceVersion",
            Field::Manager => "metadata.managedFields[0].manager",
            Field::Continue => "metadata.continue",
            Field::Kind => "kind",
            Field::ApiVersion => "apiVersion",
            Field::Label => "a label value",
        })
    }
}

/// What a huge string is made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fill {
    /// `x`s.
    Plain,
    /// JSON escapes of control characters (ANSI colours, bell, newlines, tabs).
    Escapes,
    /// Multi-byte UTF-8.
    Multibyte,
    /// Raw control bytes, which JSON does not allow in a string.
    RawControl,
    /// Bytes that are not UTF-8.
    InvalidUtf8,
}

impl fmt::Display for Fill {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Fill::Plain => "`x`s",
            Fill::Escapes => "escaped control characters",
            Fill::Multibyte => "multi-byte UTF-8",
            Fill::RawControl => "raw control bytes",
            Fill::InvalidUtf8 => "invalid UTF-8",
        })
    }
}

/// An invalid object name.
#[derive(Clone, Debug, PartialEq, Eq)]
enum BadName {
    Newline,
    Control,
    Uppercase,
    TooLong(usize),
    Empty,
    Slash,
    DotDot,
    Spaces,
    Unicode,
}

impl BadName {
    fn value(&self) -> String {
        match self {
            BadName::Newline => "fuzz\nname-0.1.0".to_owned(),
            BadName::Control => "fuzz\u{1b}[31m\u{7}-0.1.0".to_owned(),
            BadName::Uppercase => "Fuzz-Name-0.1.0".to_owned(),
            BadName::TooLong(len) => "n".repeat(*len),
            BadName::Empty => String::new(),
            BadName::Slash => "../../api/v1/secrets".to_owned(),
            BadName::DotDot => "..".to_owned(),
            BadName::Spaces => "fuzz name 0.1.0".to_owned(),
            BadName::Unicode => "fuzz-ñame-\u{202e}0.1.0".to_owned(),
        }
    }
}

impl fmt::Display for BadName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadName::Newline => f.write_str("with a newline"),
            BadName::Control => f.write_str("with control characters"),
            BadName::Uppercase => f.write_str("in upper case"),
            BadName::TooLong(len) => write!(f, "of {len} characters"),
            BadName::Empty => f.write_str("that is empty"),
            BadName::Slash => f.write_str("that is a path (`../../api/v1/secrets`)"),
            BadName::DotDot => f.write_str("`..`"),
            BadName::Spaces => f.write_str("with spaces"),
            BadName::Unicode => f.write_str("with non-ASCII and a right-to-left override"),
        }
    }
}

/// An odd resourceVersion in an apply answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OddRv {
    Empty,
    Negative,
    Long,
    NonNumeric,
    Number,
    Null,
    Object,
    LeadingZeros,
    Float,
}

impl OddRv {
    /// The value, or `None` for [`OddRv::Long`] (a fill of digits).
    fn value(self) -> Option<Value> {
        Some(match self {
            OddRv::Empty => json!(""),
            OddRv::Negative => json!("-42"),
            OddRv::Long => return None,
            OddRv::NonNumeric => json!("not-a-version\u{1b}[0m"),
            OddRv::Number => json!(42),
            OddRv::Null => Value::Null,
            OddRv::Object => json!({"rv": "1"}),
            OddRv::LeadingZeros => json!("000000000000000000000000000000000042"),
            OddRv::Float => json!(4.2e300),
        })
    }
}

impl fmt::Display for OddRv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OddRv::Empty => "empty",
            OddRv::Negative => "\"-42\"",
            OddRv::Long => "of 1 MiB of digits",
            OddRv::NonNumeric => "not a number, with an escape sequence",
            OddRv::Number => "as a JSON number",
            OddRv::Null => "null",
            OddRv::Object => "an object",
            OddRv::LeadingZeros => "with 34 leading zeros",
            OddRv::Float => "a float of 1e300",
        })
    }
}

/// What is sent instead of HTTP.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Garbage {
    Random { len: usize },
    Ssh,
    Http2,
    BadStatusLine,
    BadHeaderLine,
    NegativeLength,
    BodyOnly,
}

impl fmt::Display for Garbage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Garbage::Random { len } => write!(f, "{len} random bytes"),
            Garbage::Ssh => f.write_str("an SSH banner"),
            Garbage::Http2 => f.write_str("HTTP/2 frames"),
            Garbage::BadStatusLine => f.write_str("a status line `HTTP/1.1 2OO OK`"),
            Garbage::BadHeaderLine => f.write_str("a header line without a colon"),
            Garbage::NegativeLength => f.write_str("Content-Length -5"),
            Garbage::BodyOnly => f.write_str("the body without a head"),
        }
    }
}

fn size(len: usize) -> String {
    if len >= MIB && len.is_multiple_of(MIB) {
        format!("{} MiB", len / MIB)
    } else if len >= MIB && len.is_multiple_of(MIB / 2) {
        format!("{}.5 MiB", len / MIB)
    } else if len >= KIB && len.is_multiple_of(KIB) {
        format!("{} KiB", len / KIB)
    } else {
        format!("{len} bytes")
    }
}

impl FuzzCase {
    /// Case `index` of `seed`.
    pub fn new(seed: u64, index: u64) -> Self {
        let key = mix(seed, index);
        let mut rng = StdRng::seed_from_u64(key);
        let shape = draw_shape(&mut rng);
        let lists = if rng.random_bool(0.3) { draw_list_mode(&mut rng) } else { ListMode::Honest };
        let count = match rng.random_range(0..10) {
            0..=5 => 1,
            6..=8 => 2,
            _ => 3,
        };
        let triggers = (0..count)
            .map(|_| {
                // The lower of two draws: early requests (namespace, CRDs, first pages) come
                // first in every sync, so they are the ones most cases reach.
                let at = rng.random_range(0..TRIGGER_SPAN).min(rng.random_range(0..TRIGGER_SPAN));
                let (target, hostile) = draw_hostile(&mut rng);
                Trigger { at, target, hostile }
            })
            .collect();
        let syncs = if rng.random_bool(0.25) { 2 } else { 1 };
        Self { seed, index, key, triggers, lists, shape, syncs }
    }

    /// Case `index` of `seed` with nothing hostile: the honest SKR alone, which a sync must
    /// get through (a check of the fuzzer itself).
    pub fn honest(seed: u64, index: u64) -> Self {
        let mut case = Self::new(seed, index);
        case.triggers.clear();
        case.lists = ListMode::Honest;
        case
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The index.
    pub fn index(&self) -> u64 {
        self.index
    }

    /// The loopback address its server listens on.
    pub fn ip(&self) -> IpAddr {
        // The remainder is below ADDRESS_SPREAD, a u8.
        address(u8::try_from(self.index % u64::from(ADDRESS_SPREAD)).unwrap_or_default())
    }

    /// How many syncs, one after the other and sharing their state, the case is meant for:
    /// 1, or 2 so that the second sync is warm (metadata-only lists, no namespace and CRD
    /// checks) and meets the triggers the first did not reach.
    pub fn syncs(&self) -> usize {
        self.syncs
    }

    /// Whether the case has anything hostile at all.
    pub fn is_hostile(&self) -> bool {
        !self.triggers.is_empty() || self.lists != ListMode::Honest
    }

    /// The kinds of hostile answers of the case (`status`, `framing`, `huge-field`,
    /// `list-loops`, ...), bounded labels for counting.
    pub fn kinds(&self) -> Vec<&'static str> {
        let mut kinds: Vec<&'static str> = self.triggers.iter().map(|t| t.hostile.kind()).collect();
        kinds.extend(self.lists.kind());
        kinds.sort_unstable();
        kinds.dedup();
        kinds
    }

    /// One line for a human: what is hostile in this case, and what the honest SKR holds.
    pub fn description(&self) -> String {
        let mut parts: Vec<String> =
            self.triggers.iter().map(|t| format!("from request {} on, {}: {}", t.at, t.target, t.hostile)).collect();
        if self.lists != ListMode::Honest || parts.is_empty() {
            parts.push(self.lists.to_string());
        }
        let s = &self.shape;
        parts.push(format!(
            "(honest part: pages of {}, {} orphans and {} foreign objects per kind{}{}, {} sync{})",
            s.page_size,
            s.orphans,
            s.foreign,
            if s.namespace_missing { ", namespace missing" } else { "" },
            if s.crds_missing { ", CRDs missing" } else { "" },
            self.syncs,
            if self.syncs == 1 { "" } else { "s" },
        ));
        parts.join("; ")
    }
}

impl fmt::Display for FuzzCase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "case {} of seed {}: {}", self.index, self.seed, self.description())
    }
}

fn draw_shape(rng: &mut StdRng) -> Shape {
    Shape {
        page_size: rng.random_range(1..=4),
        listed: rng.random(),
        orphans: rng.random_range(0..=3),
        foreign: rng.random_range(0..=2),
        namespace_missing: rng.random_bool(0.15),
        crds_missing: rng.random_bool(0.15),
        other_manager: if rng.random_bool(0.3) { rng.random_range(0..=1000) } else { 0 },
        drifted: rng.random_bool(0.5),
        gone: if rng.random_bool(0.3) { rng.random_range(0..=1000) } else { 0 },
    }
}

fn draw_list_mode(rng: &mut StdRng) -> ListMode {
    // Heavy lists are drawn least often: each moves the whole sync budget (64 MiB) through
    // TLS, a good part of a second of a debug build's CPU.
    match rng.random_range(0..10) {
        0..=1 => ListMode::Loops,
        2..=3 => ListMode::Grows,
        4..=5 => ListMode::GoneAt(rng.random_range(1..=3)),
        6..=8 => ListMode::Endless,
        _ => ListMode::Heavy,
    }
}

fn pick<T: Clone>(rng: &mut StdRng, options: &[T]) -> T {
    options[rng.random_range(0..options.len())].clone()
}

fn draw_code(rng: &mut StdRng) -> u16 {
    const CODES: [u16; 38] = [
        100, 101, 102, 103, 199, 200, 201, 202, 203, 204, 206, 299, 300, 301, 302, 304, 307, 399, 400, 401, 403, 404,
        405, 406, 409, 410, 413, 415, 422, 429, 431, 499, 500, 501, 502, 503, 504, 599,
    ];
    if rng.random_bool(0.2) { rng.random_range(100..=599) } else { pick(rng, &CODES) }
}

fn draw_fill(rng: &mut StdRng) -> Fill {
    pick(
        rng,
        &[Fill::Plain, Fill::Plain, Fill::Escapes, Fill::Escapes, Fill::Multibyte, Fill::RawControl, Fill::InvalidUtf8],
    )
}

fn draw_status_shape(rng: &mut StdRng) -> StatusShape {
    match rng.random_range(0..11) {
        0 => StatusShape::Proper,
        1 => StatusShape::NoBody,
        2 => StatusShape::EmptyObject,
        3 => StatusShape::MissingFields,
        4 => StatusShape::NotAnObject(pick(rng, &["null", "[]", "\"a string\"", "42", "true"])),
        5 => StatusShape::WrongTypes,
        6 => StatusShape::HugeMessage { len: pick(rng, &HUGE_LENGTHS), fill: draw_fill(rng) },
        7 => StatusShape::HugeReason { len: pick(rng, &HUGE_LENGTHS), fill: draw_fill(rng) },
        8 => StatusShape::HugeCauses { count: pick(rng, &[10, 800, 5_000, 100_000]) },
        9 => StatusShape::CodeDisagrees { code: draw_code(rng) },
        _ => StatusShape::Html,
    }
}

fn draw_framing(rng: &mut StdRng) -> Framing {
    match rng.random_range(0..8) {
        0 => Framing::LongerLength(pick(rng, &[1, 17, 4096, 10 * MIB])),
        1 => Framing::ShorterLength(rng.random_range(1..=64)),
        2 => Framing::CloseDelimited { abort: rng.random_bool(0.5) },
        3 => Framing::Chunked { max: pick(rng, &[1, 7, 1000, CHUNK]) },
        4 => Framing::ChunkLies,
        5 => Framing::Trickle {
            bytes: rng.random_range(1..=8),
            interval_ms: rng.random_range(100..=500),
            chunked: rng.random_bool(0.5),
        },
        6 => Framing::LengthAndChunked,
        _ => Framing::TwoLengths,
    }
}

fn draw_hostile(rng: &mut StdRng) -> (Target, Hostile) {
    let metadata_target = |rng: &mut StdRng| pick(rng, &[Target::List, Target::List, Target::Apply, Target::Any]);
    match rng.random_range(0..20) {
        0..=2 => (Target::Any, Hostile::Status { code: draw_code(rng), shape: draw_status_shape(rng) }),
        3..=4 => (Target::Any, Hostile::Framing(draw_framing(rng))),
        5 => (Target::Any, Hostile::Truncated { permille: rng.random_range(0..1000) }),
        6 => (
            Target::Any,
            Hostile::DeepNesting {
                depth: pick(rng, &[200, 10_000, 100_000, 1_000_000]),
                arrays: rng.random_bool(0.7),
                closed: rng.random_bool(0.5),
            },
        ),
        7 => (metadata_target(rng), Hostile::InvalidUtf8 { len: rng.random_range(1..=64) }),
        8..=9 => {
            let field = pick(
                rng,
                &[
                    Field::Name,
                    Field::Namespace,
                    Field::Uid,
                    Field::ResourceVersion,
                    Field::Manager,
                    Field::Continue,
                    Field::Kind,
                    Field::ApiVersion,
                    Field::Label,
                ],
            );
            let target = if field == Field::Continue { Target::List } else { metadata_target(rng) };
            (target, Hostile::HugeField { field, len: pick(rng, &HUGE_LENGTHS), fill: draw_fill(rng) })
        }
        10 => {
            let name = match rng.random_range(0..9) {
                0 => BadName::Newline,
                1 => BadName::Control,
                2 => BadName::Uppercase,
                3 => BadName::TooLong(rng.random_range(254..=400)),
                4 => BadName::Empty,
                5 => BadName::Slash,
                6 => BadName::DotDot,
                7 => BadName::Spaces,
                _ => BadName::Unicode,
            };
            (pick(rng, &[Target::List, Target::Apply]), Hostile::BadName(name))
        }
        11 => {
            let hostile = if rng.random_bool(0.5) { Hostile::WrongKind } else { Hostile::WrongNamespace };
            (pick(rng, &[Target::List, Target::List, Target::Apply]), hostile)
        }
        12 => {
            let rv = pick(
                rng,
                &[
                    OddRv::Empty,
                    OddRv::Negative,
                    OddRv::Long,
                    OddRv::NonNumeric,
                    OddRv::Number,
                    OddRv::Null,
                    OddRv::Object,
                    OddRv::LeadingZeros,
                    OddRv::Float,
                ],
            );
            (pick(rng, &[Target::Apply, Target::Apply, Target::List]), Hostile::OddResourceVersion(rv))
        }
        13 => (Target::Any, Hostile::CutHeaders { keep: rng.random_range(0..120) }),
        14 => (Target::Any, Hostile::CutBody { permille: rng.random_range(0..1000) }),
        15 => {
            let garbage = match rng.random_range(0..7) {
                0 => Garbage::Random { len: pick(rng, &[1, 100, 16 * KIB]) },
                1 => Garbage::Ssh,
                2 => Garbage::Http2,
                3 => Garbage::BadStatusLine,
                4 => Garbage::BadHeaderLine,
                5 => Garbage::NegativeLength,
                _ => Garbage::BodyOnly,
            };
            (Target::Any, Hostile::Garbage(garbage))
        }
        16 => (Target::Any, Hostile::Hang),
        17 => (
            Target::Any,
            Hostile::Informational {
                code: pick(rng, &[100, 102, 103, 199]),
                count: pick(rng, &[1, 10, 1_000, 100_000]),
                then_close: rng.random_bool(0.3),
            },
        ),
        18 => {
            let hostile = if rng.random_bool(0.5) {
                Hostile::HugeHeader { len: pick(rng, &[8 * KIB, 100 * KIB, MIB]) }
            } else {
                Hostile::ManyHeaders { count: pick(rng, &[101, 1_000, 100_000]) }
            };
            (Target::Any, hostile)
        }
        _ => (Target::Any, Hostile::NotJson),
    }
}

// ------------------------------------------------------------------------------------------
// Bodies: pieces, fills and drafts

/// A body (or head) as a few pieces, some of them a block repeated.
#[derive(Clone, Debug, Default)]
struct Pieces(Vec<Piece>);

#[derive(Clone, Debug)]
enum Piece {
    Bytes(Bytes),
    /// `len` bytes of `block` repeated; `len` is a multiple of the unit the block repeats.
    Repeat {
        block: Bytes,
        len: usize,
    },
}

impl Pieces {
    fn from_bytes(bytes: impl Into<Bytes>) -> Self {
        Self(vec![Piece::Bytes(bytes.into())])
    }

    fn push(&mut self, bytes: impl Into<Bytes>) {
        self.0.push(Piece::Bytes(bytes.into()));
    }

    fn repeat(&mut self, block: Bytes, len: usize) {
        self.0.push(Piece::Repeat { block, len });
    }

    fn append(&mut self, other: Pieces) {
        self.0.extend(other.0);
    }

    fn len(&self) -> usize {
        self.0
            .iter()
            .map(|p| match p {
                Piece::Bytes(b) => b.len(),
                Piece::Repeat { len, .. } => *len,
            })
            .sum()
    }

    /// Keeps the first `keep` bytes.
    fn truncate(&mut self, keep: usize) {
        let mut left = keep;
        let mut out = Vec::new();
        for piece in self.0.drain(..) {
            if left == 0 {
                break;
            }
            match piece {
                Piece::Bytes(b) => {
                    let n = b.len().min(left);
                    out.push(Piece::Bytes(b.slice(..n)));
                    left -= n;
                }
                Piece::Repeat { block, len } => {
                    let n = len.min(left);
                    out.push(Piece::Repeat { block, len: n });
                    left -= n;
                }
            }
        }
        self.0 = out;
    }

    /// The bytes, in pieces of at most [`CHUNK`] bytes, generated as they are taken.
    fn chunks(&self) -> impl Iterator<Item = Bytes> + Send + '_ {
        self.0.iter().flat_map(|piece| -> Box<dyn Iterator<Item = Bytes> + Send> {
            match piece {
                Piece::Bytes(b) => {
                    let b = b.clone();
                    Box::new((0..b.len()).step_by(CHUNK).map(move |at| b.slice(at..b.len().min(at + CHUNK))))
                }
                Piece::Repeat { block, len } => Box::new(repeat_block(block.clone(), *len)),
            }
        })
    }

    /// All bytes at once, for small bodies and tests.
    #[cfg(test)]
    fn to_vec(&self) -> Vec<u8> {
        self.chunks().flat_map(|c| c.to_vec()).collect()
    }
}

/// `unit` repeated to about [`CHUNK`] bytes, a whole number of times.
fn block_of(unit: &[u8]) -> Bytes {
    Bytes::from(unit.repeat((CHUNK / unit.len()).max(1)))
}

static MULTIBYTE_BLOCK: LazyLock<Bytes> = LazyLock::new(|| block_of("äöü€😀".as_bytes()));
static RAW_CONTROL_BLOCK: LazyLock<Bytes> = LazyLock::new(|| block_of(b"\x1b[31m\x07\x00\n\r\t"));
static INVALID_UTF8_BLOCK: LazyLock<Bytes> = LazyLock::new(|| block_of(b"\xff\xfe\xc3(\xa0\xa1"));
static DIGITS_BLOCK: LazyLock<Bytes> = LazyLock::new(|| block_of(b"1234567890"));
/// One of many `details.causes`, with its trailing comma (see [`Draft::splice`]).
const CAUSE_UNIT: &[u8] = br#"{"reason":"FieldValueInvalid","message":"fuzz\u001b[31m","field":"spec.x"},"#;
static CAUSES_BLOCK: LazyLock<Bytes> = LazyLock::new(|| block_of(CAUSE_UNIT));
/// One of many header lines.
const HEADER_UNIT: &[u8] = b"X-Fuzz: 1\r\n";
static HEADERS_BLOCK: LazyLock<Bytes> = LazyLock::new(|| block_of(HEADER_UNIT));
static OPEN_ARRAYS: LazyLock<Bytes> = LazyLock::new(|| block_of(b"["));
static CLOSE_ARRAYS: LazyLock<Bytes> = LazyLock::new(|| block_of(b"]"));
static OPEN_OBJECTS: LazyLock<Bytes> = LazyLock::new(|| block_of(br#"{"a":"#));
static CLOSE_OBJECTS: LazyLock<Bytes> = LazyLock::new(|| block_of(b"}"));

/// `len` bytes of `unit`s from `block` (whole units), then `x`s for the rest.
fn whole_units(block: &Bytes, unit: usize, len: usize) -> Pieces {
    let whole = len - len % unit;
    let mut pieces = Pieces::default();
    pieces.repeat(block.clone(), whole);
    pieces.repeat(Bytes::from_static(&PADDING), len - whole);
    pieces
}

impl Fill {
    /// `len` bytes of this fill, as they go inside a JSON string.
    fn pieces(self, len: usize) -> Pieces {
        match self {
            Fill::Plain => whole_units(&Bytes::from_static(&PADDING), 1, len),
            Fill::Escapes => whole_units(&CONTROL_BLOCK, CONTROL_UNIT.len(), len),
            Fill::Multibyte => whole_units(&MULTIBYTE_BLOCK, "äöü€😀".len(), len),
            Fill::RawControl => whole_units(&RAW_CONTROL_BLOCK, 9, len),
            Fill::InvalidUtf8 => whole_units(&INVALID_UTF8_BLOCK, 6, len),
        }
    }
}

/// What replaces a placeholder of a [`Draft`].
#[derive(Clone, Debug)]
enum Splice {
    /// The content of a JSON string: the quotes stay.
    InString(Pieces),
    /// Raw JSON in place of the placeholder and the comma after it (array elements that end
    /// in a comma each).
    Elements(Pieces),
}

/// An answer before it is framed: a status, and a JSON body with placeholders for big
/// strings, or raw bytes.
#[derive(Clone, Debug)]
struct Draft {
    status: u16,
    content_type: Option<&'static str>,
    json: Option<Value>,
    raw: Pieces,
    splices: Vec<Splice>,
}

impl Draft {
    fn json(status: u16, body: Value) -> Self {
        Self {
            status,
            content_type: Some("application/json"),
            json: Some(body),
            raw: Pieces::default(),
            splices: Vec::new(),
        }
    }

    fn raw(status: u16, content_type: Option<&'static str>, raw: Pieces) -> Self {
        Self { status, content_type, json: None, raw, splices: Vec::new() }
    }

    /// A placeholder string that becomes `splice` when written.
    fn placeholder(&mut self, splice: Splice) -> Value {
        self.splices.push(splice);
        Value::String(format!("{FILL_MARK}{}@@", self.splices.len() - 1))
    }

    fn fill(&mut self, fill: Fill, len: usize) -> Value {
        self.placeholder(Splice::InString(fill.pieces(len)))
    }

    /// The body: the JSON text with the placeholders spliced in, or the raw bytes. Never more
    /// than [`MAX_BODY`].
    fn body(&self) -> Pieces {
        let Some(json) = &self.json else { return self.raw.clone() };
        let mut pieces = self.splice(&json.to_string());
        pieces.truncate(MAX_BODY);
        pieces
    }

    fn splice(&self, text: &str) -> Pieces {
        let mut pieces = Pieces::default();
        let mut rest = text;
        let quoted_mark = format!("\"{FILL_MARK}");
        while let Some(at) = rest.find(&quoted_mark) {
            let after = &rest[at + quoted_mark.len()..];
            let Some(end) = after.find("@@\"") else { break };
            let Some(splice) = after[..end].parse::<usize>().ok().and_then(|i| self.splices.get(i)) else { break };
            let mut next = &after[end + 3..];
            match splice {
                Splice::InString(fill) => {
                    pieces.push(Bytes::copy_from_slice(&rest.as_bytes()[..=at]));
                    pieces.append(fill.clone());
                    pieces.push(Bytes::from_static(b"\""));
                }
                Splice::Elements(elements) => {
                    pieces.push(Bytes::copy_from_slice(&rest.as_bytes()[..at]));
                    pieces.append(elements.clone());
                    next = next.strip_prefix(',').unwrap_or(next);
                }
            }
            rest = next;
        }
        pieces.push(Bytes::copy_from_slice(rest.as_bytes()));
        pieces
    }
}

fn status_value(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": if (200..300).contains(&code) { "Success" } else { "Failure" },
        "message": message,
        "reason": reason,
        "code": code,
    })
}

fn not_found(what: &str) -> Draft {
    Draft::json(404, status_value(404, "NotFound", &format!("{what} not found")))
}

const HTML: &str = "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\n<center><h1>502 Bad Gateway</h1></center>\n<hr><center>nginx</center>\n</body>\n</html>\n";

fn status_draft(code: u16, shape: &StatusShape) -> Draft {
    let proper = || status_value(code, "FuzzReason", "the fuzz SKR says no");
    match shape {
        StatusShape::Proper => Draft::json(code, proper()),
        StatusShape::NoBody => Draft::raw(code, None, Pieces::default()),
        StatusShape::EmptyObject => Draft::json(code, json!({})),
        StatusShape::MissingFields => Draft::json(code, json!({"kind": "Status"})),
        StatusShape::NotAnObject(body) => Draft::raw(code, Some("application/json"), Pieces::from_bytes(*body)),
        StatusShape::WrongTypes => Draft::json(
            code,
            json!({"kind": "Status", "apiVersion": 7, "metadata": "m", "status": {"a": 1}, "message": {"text": "m"},
                   "reason": ["Forbidden"], "details": "none", "code": code.to_string()}),
        ),
        StatusShape::HugeMessage { len, fill } => {
            let mut draft = Draft::json(code, proper());
            let value = draft.fill(*fill, *len);
            if let Some(body) = draft.json.as_mut() {
                body["message"] = value;
            }
            draft
        }
        StatusShape::HugeReason { len, fill } => {
            let mut draft = Draft::json(code, proper());
            let value = draft.fill(*fill, *len);
            if let Some(body) = draft.json.as_mut() {
                body["reason"] = value;
            }
            draft
        }
        StatusShape::HugeCauses { count } => {
            let mut draft = Draft::json(code, proper());
            let len = (count * CAUSE_UNIT.len()).min(MAX_BODY - 4 * KIB);
            let causes = draft.placeholder(Splice::Elements(whole_units(&CAUSES_BLOCK, CAUSE_UNIT.len(), len)));
            if let Some(body) = draft.json.as_mut() {
                body["details"] = json!({"name": "fuzz", "causes": [causes, {"reason": "Last", "message": "last"}]});
            }
            draft
        }
        StatusShape::CodeDisagrees { code: other } => {
            Draft::json(code, status_value(*other, "FuzzReason", "the code in the body is another"))
        }
        StatusShape::Html => Draft::raw(code, Some("text/html"), Pieces::from_bytes(HTML)),
    }
}

// ------------------------------------------------------------------------------------------
// Requests

/// One request as read from the connection.
#[derive(Clone, Debug, Default)]
struct Request {
    method: String,
    /// Path and query, as sent.
    target: String,
    headers: Vec<(String, String)>,
    /// The body, at most [`MAX_KEPT_BODY`] of it.
    body: Vec<u8>,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn path(&self) -> &str {
        self.target.split_once('?').map_or(self.target.as_str(), |(path, _)| path)
    }

    fn query(&self, key: &str) -> Option<&str> {
        let (_, query) = self.target.split_once('?')?;
        query.split('&').find_map(|pair| pair.strip_prefix(key)?.strip_prefix('='))
    }

    /// `METHOD target`, cut short: for [`FuzzSkr::fired`].
    fn line(&self) -> String {
        let target: String = self.target.chars().take(160).map(|c| if c.is_control() { ' ' } else { c }).collect();
        let cut = if self.target.chars().count() > 160 { "..." } else { "" };
        format!("{} {target}{cut}", self.method)
    }
}

/// Why no request could be read.
enum ReadError {
    /// The client closed the connection (or it broke).
    Closed,
    /// The head was longer than [`MAX_REQUEST_HEAD`].
    HeadTooLarge,
}

impl From<io::Error> for ReadError {
    fn from(_: io::Error) -> Self {
        ReadError::Closed
    }
}

async fn fill_buf<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut Vec<u8>) -> Result<(), ReadError> {
    let mut chunk = [0u8; 16 * KIB];
    let n = stream.read(&mut chunk).await?;
    if n == 0 {
        return Err(ReadError::Closed);
    }
    buf.extend_from_slice(&chunk[..n]);
    Ok(())
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads one request; bytes read beyond it stay in `buf`.
async fn read_request<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut Vec<u8>) -> Result<Request, ReadError> {
    let head_end = loop {
        if let Some(at) = find(buf, b"\r\n\r\n") {
            break at;
        }
        if buf.len() > MAX_REQUEST_HEAD {
            return Err(ReadError::HeadTooLarge);
        }
        fill_buf(stream, buf).await?;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    buf.drain(..head_end + 4);
    let mut lines = head.split("\r\n");
    let mut first = lines.next().unwrap_or_default().split(' ');
    let mut request = Request {
        method: first.next().unwrap_or_default().to_owned(),
        target: first.next().unwrap_or_default().to_owned(),
        ..Request::default()
    };
    request.headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    if request.header("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let line_end = loop {
                if let Some(at) = find(buf, b"\r\n") {
                    break at;
                }
                fill_buf(stream, buf).await?;
            };
            let size = String::from_utf8_lossy(&buf[..line_end]);
            let size = usize::from_str_radix(size.split(';').next().unwrap_or_default().trim(), 16).unwrap_or(0);
            buf.drain(..line_end + 2);
            read_body(stream, buf, size + 2, &mut request.body).await?;
            request.body.truncate(request.body.len().saturating_sub(2));
            if size == 0 {
                break;
            }
        }
    } else {
        let len = request.header("content-length").and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
        read_body(stream, buf, len, &mut request.body).await?;
    }
    Ok(request)
}

/// Reads `len` body bytes, keeping up to [`MAX_KEPT_BODY`] of them in `kept`.
async fn read_body<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut Vec<u8>,
    mut len: usize,
    kept: &mut Vec<u8>,
) -> Result<(), ReadError> {
    while len > 0 {
        if buf.is_empty() {
            fill_buf(stream, buf).await?;
        }
        let n = len.min(buf.len());
        let room = MAX_KEPT_BODY.saturating_sub(kept.len()).min(n);
        kept.extend_from_slice(&buf[..room]);
        buf.drain(..n);
        len -= n;
    }
    Ok(())
}

/// What a request asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Class {
    NamespaceGet,
    NamespaceApply,
    CrdGet(String),
    CrdApply(String),
    List { plural: String, metadata_only: bool },
    Apply { plural: String, name: String },
    ObjectGet { plural: String, name: String },
    Replace { plural: String, name: String },
    Delete { plural: String, name: String },
    Other,
}

fn classify(request: &Request) -> Class {
    let segments: Vec<&str> = request.path().trim_start_matches('/').split('/').collect();
    let method = request.method.as_str();
    match (method, segments.as_slice()) {
        ("GET", ["api", "v1", "namespaces", _]) => Class::NamespaceGet,
        ("PATCH", ["api", "v1", "namespaces", _]) => Class::NamespaceApply,
        ("GET", ["apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions", name]) => {
            Class::CrdGet((*name).to_owned())
        }
        ("PATCH", ["apis", "apiextensions.k8s.io", "v1", "customresourcedefinitions", name]) => {
            Class::CrdApply((*name).to_owned())
        }
        ("GET", ["apis", "operator.kyma-project.io", "v1beta2", "namespaces", _, plural]) => Class::List {
            plural: (*plural).to_owned(),
            metadata_only: request.header("accept").is_some_and(|a| a.contains("as=PartialObjectMetadataList")),
        },
        (method, ["apis", "operator.kyma-project.io", "v1beta2", "namespaces", _, plural, name]) => {
            let (plural, name) = ((*plural).to_owned(), (*name).to_owned());
            match method {
                "PATCH" => Class::Apply { plural, name },
                "GET" => Class::ObjectGet { plural, name },
                "PUT" => Class::Replace { plural, name },
                "DELETE" => Class::Delete { plural, name },
                _ => Class::Other,
            }
        }
        _ => Class::Other,
    }
}

// ------------------------------------------------------------------------------------------
// The honest SKR

fn kind_of(plural: &str) -> &'static str {
    match plural {
        "moduletemplates" => "ModuleTemplate",
        "modulereleasemetas" => "ModuleReleaseMeta",
        _ => "Unknown",
    }
}

fn uid(rng: &mut StdRng) -> String {
    let (a, b): (u64, u64) = (rng.random(), rng.random());
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

fn managed_fields(managers: &[&str]) -> Value {
    let entries: Vec<Value> = managers
        .iter()
        .map(|manager| {
            json!({"manager": manager, "operation": "Apply", "apiVersion": CATALOG_API_VERSION,
                   "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {}}})
        })
        .collect();
    Value::Array(entries)
}

/// `object` as the SKR stores it: with a uid, a resourceVersion, managed fields and so on.
fn stored(mut object: Value, namespace: &str, rv: u64, managers: &[&str], rng: &mut StdRng) -> Value {
    if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("namespace".into(), json!(namespace));
        meta.insert("uid".into(), json!(uid(rng)));
        meta.insert("resourceVersion".into(), json!(rv.to_string()));
        meta.insert("generation".into(), json!(1));
        meta.insert("creationTimestamp".into(), json!("2026-01-01T00:00:00Z"));
        meta.insert("managedFields".into(), managed_fields(managers));
    }
    object
}

/// An object of kind `plural` that no desired copy is.
fn stray(plural: &str, name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": CATALOG_API_VERSION,
        "kind": kind_of(plural),
        "metadata": {"name": name, "labels": labels},
        "spec": {"moduleName": "fuzz-stray", "version": "0.0.1"},
    })
}

/// Only the metadata, as a metadata-only list or GET has it.
fn as_metadata_only(object: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": object["metadata"]})
}

/// Padding per item and page number of a growing list: page `n` has `n` items of `n` times
/// this, so page 8 is past the client's 8 MiB limit and page 11 about 15 MiB (the largest,
/// [`GROW_LAST`], under [`MAX_BODY`]).
const GROW_PAD: usize = 128 * KIB;
/// The page number from which a growing list stops growing: its pages stay under [`MAX_BODY`].
const GROW_LAST: usize = 11;
/// Items of a heavy page: no more than a full list asks for (50), [`HEAVY_PAD`] each.
const HEAVY_ITEMS: usize = 48;
/// Padding per item of a heavy page: 48 of them make 7.5 MiB, just under
/// `--skr-max-response-size`'s default (8 MiB), so nine pages spend `--skr-sync-budget`'s
/// default (64 MiB).
const HEAVY_PAD: usize = 160 * KIB;

struct State {
    fired: Vec<bool>,
    log: Vec<String>,
    created: BTreeSet<String>,
    list_noted: bool,
}

/// State shared between the [`FuzzSkr`] handle and its thread.
struct Shared {
    case: FuzzCase,
    honest: Arc<Honest>,
    /// The honest list items per plural, in full.
    items: BTreeMap<String, Vec<Value>>,
    connections: AtomicUsize,
    requests: AtomicUsize,
    /// Connections whose handling panicked: a bug of the fuzzer, not of the client.
    panics: AtomicUsize,
    state: Mutex<State>,
}

impl Shared {
    fn new(case: FuzzCase, honest: Arc<Honest>) -> Self {
        let mut items = BTreeMap::new();
        for plural in ["moduletemplates", "modulereleasemetas"] {
            let mut rng = StdRng::seed_from_u64(mix(case.key, splitmix(plural.len() as u64)));
            let mut listed = Vec::new();
            let mut rv = 1000;
            for (i, copy) in honest.copies.get(plural).into_iter().flatten().enumerate() {
                if case.shape.listed & (1 << (i % 32)) != 0 {
                    rv += 1;
                    listed.push(stored(copy.clone(), &honest.namespace, rv, &[SKR_FIELD_MANAGER], &mut rng));
                }
            }
            for i in 0..case.shape.orphans {
                rv += 1;
                let orphan =
                    stray(plural, &format!("fuzz-orphan-{i}-0.0.1"), json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE}));
                listed.push(stored(orphan, &honest.namespace, rv, &[SKR_FIELD_MANAGER], &mut rng));
            }
            for i in 0..case.shape.foreign {
                rv += 1;
                let foreign = stray(plural, &format!("fuzz-foreign-{i}"), json!({"team": "someone-else"}));
                listed.push(stored(foreign, &honest.namespace, rv, &["kubectl-client-side-apply"], &mut rng));
            }
            items.insert(plural.to_owned(), listed);
        }
        let state = State {
            fired: vec![false; case.triggers.len()],
            log: Vec::new(),
            created: BTreeSet::new(),
            list_noted: false,
        };
        Self {
            case,
            honest,
            items,
            connections: AtomicUsize::new(0),
            requests: AtomicUsize::new(0),
            panics: AtomicUsize::new(0),
            state: Mutex::new(state),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn note(&self, state: &mut State, entry: String) {
        if state.log.len() < MAX_FIRED {
            state.log.push(entry);
        }
    }

    /// The answer to request `index`.
    fn answer(&self, index: usize, request: &Request) -> Wire {
        let class = classify(request);
        let mut rng = StdRng::seed_from_u64(mix(self.case.key, index as u64 + 1));
        let honest = self.honest_answer(index, request, &class, &mut rng);
        let trigger = {
            let mut state = self.state();
            let found = self
                .case
                .triggers
                .iter()
                .enumerate()
                .find(|(i, t)| !state.fired[*i] && t.at <= index && t.target.matches(&class))
                .map(|(i, t)| (i, t.hostile.clone()));
            if let Some((i, hostile)) = &found {
                state.fired[*i] = true;
                self.note(&mut state, format!("request {index} {}: {hostile}", request.line()));
            }
            found
        };
        match trigger {
            Some((_, hostile)) => render_hostile(&hostile, honest, &mut rng),
            None => Wire::honest(honest),
        }
    }

    fn rv(index: usize) -> u64 {
        100_000 + index as u64
    }

    fn honest_answer(&self, index: usize, request: &Request, class: &Class, rng: &mut StdRng) -> Draft {
        let ns = &self.honest.namespace;
        let shape = &self.case.shape;
        match class {
            Class::NamespaceGet => {
                if shape.namespace_missing && !self.state().created.contains("namespace") {
                    return not_found("namespaces");
                }
                Draft::json(
                    200,
                    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {
                        "name": ns, "uid": uid(rng), "resourceVersion": Self::rv(index).to_string(),
                        "labels": {"kubernetes.io/metadata.name": ns}}}),
                )
            }
            Class::NamespaceApply => {
                self.state().created.insert("namespace".to_owned());
                Draft::json(
                    200,
                    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {
                        "name": ns, "uid": uid(rng), "resourceVersion": Self::rv(index).to_string(),
                        "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE, "kubernetes.io/metadata.name": ns}},
                        "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}}),
                )
            }
            Class::CrdGet(name) => {
                let Some(body) = self.honest.crds.get(name) else { return not_found("customresourcedefinitions") };
                if shape.crds_missing && !self.state().created.contains(name) {
                    return not_found("customresourcedefinitions");
                }
                Draft::json(200, crd_object(body, index, rng))
            }
            Class::CrdApply(name) => {
                let Some(body) = self.honest.crds.get(name) else { return not_found("customresourcedefinitions") };
                self.state().created.insert(name.clone());
                Draft::json(200, crd_object(body, index, rng))
            }
            Class::List { plural, metadata_only } => self.list_page(index, request, plural, *metadata_only),
            Class::Apply { name, .. } => {
                let mut managers = vec![SKR_FIELD_MANAGER];
                if rng.random_range(0..1000) < shape.other_manager {
                    managers.push("kubectl-edit");
                }
                Draft::json(
                    200,
                    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": {
                        "name": name, "namespace": ns, "uid": uid(rng),
                        "resourceVersion": Self::rv(index).to_string(), "generation": 1,
                        "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE},
                        "managedFields": managed_fields(&managers)}}),
                )
            }
            Class::ObjectGet { plural, name } => {
                let copy =
                    self.honest.copies.get(plural).into_iter().flatten().find(|c| c["metadata"]["name"] == **name);
                let Some(copy) = copy else { return not_found(plural) };
                let mut object = stored(copy.clone(), ns, Self::rv(index), &[SKR_FIELD_MANAGER, "kubectl-edit"], rng);
                if shape.drifted {
                    object["spec"]["fuzzDrift"] = json!(true);
                }
                Draft::json(200, object)
            }
            Class::Replace { plural, .. } => match serde_json::from_slice::<Value>(&request.body) {
                Ok(body) if body.is_object() => {
                    Draft::json(200, stored(body, ns, Self::rv(index), &[SKR_FIELD_MANAGER], rng))
                }
                _ => Draft::json(400, status_value(400, "BadRequest", &format!("the {plural} body does not parse"))),
            },
            Class::Delete { plural, name } => {
                if rng.random_range(0..1000) < shape.gone {
                    return not_found(plural);
                }
                Draft::json(
                    200,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                           "details": {"name": name, "group": "operator.kyma-project.io", "kind": plural,
                                       "uid": uid(rng)}}),
                )
            }
            Class::Other => {
                Draft::json(404, status_value(404, "NotFound", "the server could not find the requested resource"))
            }
        }
    }

    /// A page of a list, honest or as the case's [`ListMode`] says.
    fn list_page(&self, index: usize, request: &Request, plural: &str, metadata_only: bool) -> Draft {
        let page = match request.query("continue") {
            None => 0,
            Some(token) => match token.strip_prefix("fuzz-").and_then(|n| n.parse::<usize>().ok()) {
                Some(n) => n,
                None => return Draft::json(400, status_value(400, "BadRequest", "continue key is not valid")),
            },
        };
        let honest_items = self.items.get(plural).map(Vec::as_slice).unwrap_or_default();
        let size = self.case.shape.page_size;
        let honest_page = |page: usize| honest_items.iter().skip(page * size).take(size).cloned().collect::<Vec<_>>();
        let more = |page: usize| (page + 1) * size < honest_items.len();
        let mode = self.case.lists;
        let mut draft = Draft::json(200, Value::Null);
        let mut rng = StdRng::seed_from_u64(mix(self.case.key, index as u64 + 7));
        let (items, next): (Vec<Value>, Option<usize>) = match mode {
            ListMode::Honest => (honest_page(page), more(page).then_some(page + 1)),
            ListMode::Loops if page == 0 => (honest_page(0), Some(1)),
            ListMode::Loops => (honest_page(1), Some(1)),
            ListMode::GoneAt(n) if page >= n => {
                return Draft::json(
                    410,
                    status_value(
                        410,
                        "Expired",
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ),
                );
            }
            ListMode::GoneAt(_) => (honest_page(page), Some(page + 1)),
            ListMode::Grows if page == 0 => (honest_page(0), Some(1)),
            ListMode::Grows | ListMode::Heavy => {
                let (count, pad) = match mode {
                    ListMode::Heavy => (HEAVY_ITEMS, HEAVY_PAD),
                    _ => (page.min(GROW_LAST), page.min(GROW_LAST) * GROW_PAD),
                };
                let items = (0..count)
                    .map(|i| {
                        let pad = draft.fill(Fill::Plain, pad);
                        let labels = json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE});
                        let mut item = stray(plural, &format!("fuzz-grow-{page}-{i}"), labels);
                        item["metadata"]["annotations"] = json!({"fuzz.kyma-project.io/padding": pad});
                        stored(item, &self.honest.namespace, Self::rv(index), &[SKR_FIELD_MANAGER], &mut rng)
                    })
                    .collect();
                (items, Some(page + 1))
            }
            ListMode::Endless => {
                let items = (0..size)
                    .map(|i| {
                        let labels = json!({MANAGED_BY_LABEL: MANAGED_BY_VALUE});
                        let item = stray(plural, &format!("fuzz-endless-{page}-{i}"), labels);
                        stored(item, &self.honest.namespace, Self::rv(index), &[SKR_FIELD_MANAGER], &mut rng)
                    })
                    .collect();
                (items, Some(page + 1))
            }
        };
        if mode != ListMode::Honest && (page > 0 || mode == ListMode::Heavy) {
            let mut state = self.state();
            if !state.list_noted {
                state.list_noted = true;
                self.note(&mut state, format!("request {index} {}: {mode}", request.line()));
            }
        }
        let items: Vec<Value> = if metadata_only { items.iter().map(as_metadata_only).collect() } else { items };
        let mut meta = Map::new();
        meta.insert("resourceVersion".into(), json!(Self::rv(index).to_string()));
        if let Some(next) = next {
            meta.insert("continue".into(), json!(format!("fuzz-{next}")));
        }
        let (api_version, kind) = if metadata_only {
            ("meta.k8s.io/v1".to_owned(), "PartialObjectMetadataList".to_owned())
        } else {
            (CATALOG_API_VERSION.to_owned(), format!("{}List", kind_of(plural)))
        };
        draft.json = Some(json!({"apiVersion": api_version, "kind": kind, "metadata": meta, "items": items}));
        draft
    }
}

/// A CRD as the SKR serves it: `body` with identity and an established status.
fn crd_object(body: &Value, index: usize, rng: &mut StdRng) -> Value {
    let mut crd = body.clone();
    if let Some(meta) = crd.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("uid".into(), json!(uid(rng)));
        meta.insert("resourceVersion".into(), json!(Shared::rv(index).to_string()));
        meta.insert("generation".into(), json!(1));
        meta.insert("creationTimestamp".into(), json!("2026-01-01T00:00:00Z"));
    }
    let stored_versions: Vec<Value> = body["spec"]["versions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["storage"] == true)
        .map(|v| v["name"].clone())
        .collect();
    crd["status"] = json!({
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
             "message": "the initial names have been accepted", "lastTransitionTime": "2026-01-01T00:00:00Z"},
        ],
        "acceptedNames": body["spec"]["names"],
        "storedVersions": stored_versions,
    });
    crd
}

// ------------------------------------------------------------------------------------------
// Hostile answers

/// The `metadata` a field-level mutation changes: of one item of a list (drawn by `rng`),
/// else of the body itself.
fn target_meta<'a>(body: &'a mut Value, rng: &mut StdRng) -> Option<&'a mut Map<String, Value>> {
    let target = match body.get("items").and_then(Value::as_array).map(Vec::len) {
        Some(n) if n > 0 => {
            let at = rng.random_range(0..n);
            &mut body["items"][at]
        }
        _ => body,
    };
    if !target.is_object() {
        return None;
    }
    if !target["metadata"].is_object() {
        target["metadata"] = json!({});
    }
    target["metadata"].as_object_mut()
}

/// The object a kind or apiVersion mutation changes: an item, or the body itself.
fn target_object<'a>(body: &'a mut Value, rng: &mut StdRng) -> &'a mut Value {
    match body.get("items").and_then(Value::as_array).map(Vec::len) {
        Some(n) if n > 0 && rng.random_bool(0.7) => {
            let at = rng.random_range(0..n);
            &mut body["items"][at]
        }
        _ => body,
    }
}

fn set_meta(draft: &mut Draft, rng: &mut StdRng, key: &str, value: Value) {
    if let Some(meta) = draft.json.as_mut().and_then(|body| target_meta(body, rng)) {
        meta.insert(key.to_owned(), value);
    }
}

fn render_hostile(hostile: &Hostile, mut draft: Draft, rng: &mut StdRng) -> Wire {
    match hostile {
        Hostile::Status { code, shape } => {
            if *code < 200 {
                // A 1xx as the final answer: the head alone, then the connection closes.
                return Wire { informational: Some((*code, 1)), after: After::Close, ..Wire::default() };
            }
            // The connection stays open: after a 204 or 304 with a body (HTTP allows none),
            // the body's bytes wait there for the next answer.
            Wire::honest(status_draft(*code, shape))
        }
        Hostile::Framing(framing) => {
            let mut wire = Wire::honest(draft);
            wire.set_framing(framing);
            wire
        }
        Hostile::Truncated { permille } => {
            let mut body = draft.body();
            body.truncate(body.len() * usize::from(*permille) / 1000);
            Wire::honest(Draft::raw(draft.status, draft.content_type, body))
        }
        Hostile::DeepNesting { depth, arrays, closed } => {
            let (open, close, unit) = if *arrays {
                (OPEN_ARRAYS.clone(), CLOSE_ARRAYS.clone(), 1)
            } else {
                (OPEN_OBJECTS.clone(), CLOSE_OBJECTS.clone(), 5)
            };
            let mut body = Pieces::default();
            body.repeat(open, depth * unit);
            if *closed {
                if !*arrays {
                    body.push(Bytes::from_static(b"1"));
                }
                body.repeat(close, *depth);
            }
            Wire::honest(Draft::raw(200, Some("application/json"), body))
        }
        Hostile::InvalidUtf8 { len } => {
            let value = draft.fill(Fill::InvalidUtf8, *len);
            set_meta(&mut draft, rng, "name", value);
            Wire::honest(draft)
        }
        Hostile::HugeField { field, len, fill } => {
            let value = draft.fill(*fill, *len);
            match field {
                Field::Name => set_meta(&mut draft, rng, "name", value),
                Field::Namespace => set_meta(&mut draft, rng, "namespace", value),
                Field::Uid => set_meta(&mut draft, rng, "uid", value),
                Field::ResourceVersion => set_meta(&mut draft, rng, "resourceVersion", value),
                Field::Manager => {
                    set_meta(&mut draft, rng, "managedFields", json!([{"manager": value, "operation": "Apply"}]));
                }
                Field::Continue => {
                    if let Some(body) = draft.json.as_mut().filter(|b| b.is_object()) {
                        body["metadata"]["continue"] = value;
                    }
                }
                Field::Kind | Field::ApiVersion => {
                    if let Some(body) = draft.json.as_mut() {
                        let object = target_object(body, rng);
                        if object.is_object() {
                            object[if *field == Field::Kind { "kind" } else { "apiVersion" }] = value;
                        }
                    }
                }
                Field::Label => set_meta(&mut draft, rng, "labels", json!({"fuzz": value})),
            }
            Wire::honest(draft)
        }
        Hostile::BadName(name) => {
            set_meta(&mut draft, rng, "name", json!(name.value()));
            Wire::honest(draft)
        }
        Hostile::WrongKind => {
            if let Some(body) = draft.json.as_mut() {
                let object = target_object(body, rng);
                if object.is_object() {
                    object["kind"] = json!("Secret");
                    object["apiVersion"] = json!("v1");
                }
            }
            Wire::honest(draft)
        }
        Hostile::WrongNamespace => {
            set_meta(&mut draft, rng, "namespace", json!("kube-system"));
            Wire::honest(draft)
        }
        Hostile::OddResourceVersion(rv) => {
            let value =
                rv.value().unwrap_or_else(|| draft.placeholder(Splice::InString(whole_units(&DIGITS_BLOCK, 1, MIB))));
            set_meta(&mut draft, rng, "resourceVersion", value);
            Wire::honest(draft)
        }
        Hostile::CutHeaders { keep } => {
            let mut wire = Wire::honest(draft);
            wire.cut = Cut::Head(*keep);
            wire
        }
        Hostile::CutBody { permille } => {
            let len = draft.body().len();
            let mut wire = Wire::honest(draft);
            wire.cut = Cut::Body(len * usize::from(*permille) / 1000);
            wire
        }
        Hostile::Garbage(garbage) => {
            let raw = match garbage {
                Garbage::Random { len } => {
                    let mut bytes = vec![0u8; *len];
                    rng.fill(&mut bytes[..]);
                    Pieces::from_bytes(bytes)
                }
                Garbage::Ssh => Pieces::from_bytes(&b"SSH-2.0-OpenSSH_9.6p1 Ubuntu-3ubuntu13.5\r\n"[..]),
                Garbage::Http2 => Pieces::from_bytes(
                    &b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\x00\x03\x00\x00\x00\x64\x00\x04\x00\x10\x00\x00\x00\x06\x00\x00\x40\x00\x00\x00\x04\x08\x00\x00\x00\x00\x00\x00\x0f\x00\x01"[..],
                ),
                Garbage::BadStatusLine => Pieces::from_bytes(&b"HTTP/1.1 2OO OK\r\nContent-Length: 2\r\n\r\n{}"[..]),
                Garbage::BadHeaderLine => {
                    Pieces::from_bytes(&b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nbroken header line\r\n\r\n{}"[..])
                }
                Garbage::NegativeLength => Pieces::from_bytes(&b"HTTP/1.1 200 OK\r\nContent-Length: -5\r\n\r\n{}"[..]),
                Garbage::BodyOnly => draft.body(),
            };
            Wire { raw, after: if rng.random_bool(0.5) { After::Close } else { After::Abort }, ..Wire::default() }
        }
        Hostile::Hang => Wire { after: After::AwaitHangup, ..Wire::default() },
        Hostile::Informational { code, count, then_close } => {
            if *then_close {
                Wire { informational: Some((*code, *count)), after: After::Close, ..Wire::default() }
            } else {
                let mut wire = Wire::honest(draft);
                wire.informational = Some((*code, *count));
                wire
            }
        }
        Hostile::HugeHeader { len } => {
            let mut wire = Wire::honest(draft);
            wire.extra.push(Bytes::from_static(b"X-Fuzz-Padding: "));
            wire.extra.repeat(Bytes::from_static(&PADDING), *len);
            wire.extra.push(Bytes::from_static(b"\r\n"));
            wire
        }
        Hostile::ManyHeaders { count } => {
            let mut wire = Wire::honest(draft);
            wire.extra.repeat(HEADERS_BLOCK.clone(), count * HEADER_UNIT.len());
            wire
        }
        Hostile::NotJson => Wire::honest(Draft::raw(200, Some("text/html"), Pieces::from_bytes(HTML))),
    }
}

// ------------------------------------------------------------------------------------------
// The wire

/// How a body is framed on the wire.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
enum WireFraming {
    /// A Content-Length of the body's length.
    #[default]
    Exact,
    /// These Content-Length headers, whatever the body's length.
    Declared(Vec<i64>),
    /// Chunked, chunks of at most this many bytes.
    Chunked(usize),
    /// Chunked, the first chunk's size a lie.
    ChunkLies,
    /// No length; the connection's end ends the body.
    CloseDelimited,
    /// A Content-Length and chunked at once (the body chunked).
    LengthAndChunked,
}

/// What happens to the connection after an answer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum After {
    /// The next request may come.
    #[default]
    KeepAlive,
    /// close_notify, then the connection closes.
    Close,
    /// The connection closes without close_notify.
    Abort,
    /// The connection stays open, unanswered, until the client hangs up (or [`HOLD_OPEN`]).
    AwaitHangup,
}

/// Where an answer is cut off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Cut {
    #[default]
    None,
    /// After this many bytes of the head.
    Head(usize),
    /// After this many bytes of the body.
    Body(usize),
}

/// An answer as it goes on the wire.
#[derive(Clone, Debug, Default)]
struct Wire {
    /// `count` 1xx heads of `code`, sent first.
    informational: Option<(u16, usize)>,
    /// Bytes sent after them instead of an HTTP answer.
    raw: Pieces,
    /// The final answer, if any.
    draft: Option<Draft>,
    /// Header lines added to the head.
    extra: Pieces,
    framing: WireFraming,
    trickle: Option<(usize, Duration)>,
    cut: Cut,
    after: After,
}

impl Wire {
    fn honest(draft: Draft) -> Self {
        Self { draft: Some(draft), ..Self::default() }
    }

    fn set_framing(&mut self, framing: &Framing) {
        let len = self.draft.as_ref().map_or(0, |d| d.body().len()) as i64;
        match framing {
            Framing::LongerLength(n) => {
                self.framing = WireFraming::Declared(vec![len + *n as i64]);
                self.after = After::AwaitHangup;
            }
            Framing::ShorterLength(n) => self.framing = WireFraming::Declared(vec![(len - *n as i64).max(0)]),
            Framing::CloseDelimited { abort } => {
                self.framing = WireFraming::CloseDelimited;
                self.after = if *abort { After::Abort } else { After::Close };
            }
            Framing::Chunked { max } => self.framing = WireFraming::Chunked(*max),
            Framing::ChunkLies => {
                self.framing = WireFraming::ChunkLies;
                self.after = After::AwaitHangup;
            }
            Framing::Trickle { bytes, interval_ms, chunked } => {
                self.framing = if *chunked { WireFraming::Chunked(*bytes) } else { WireFraming::Exact };
                self.trickle = Some((*bytes, Duration::from_millis(*interval_ms)));
            }
            Framing::LengthAndChunked => self.framing = WireFraming::LengthAndChunked,
            Framing::TwoLengths => self.framing = WireFraming::Declared(vec![len, len + 1]),
        }
    }

    /// The head of the final answer, for a body of `len` bytes.
    fn head(&self, draft: &Draft, len: usize) -> Pieces {
        let mut head = format!("HTTP/1.1 {} {}\r\n", draft.status, phrase(draft.status));
        if let Some(content_type) = draft.content_type {
            head.push_str(&format!("Content-Type: {content_type}\r\n"));
        }
        head.push_str("Audit-Id: 00000000-0000-4000-8000-00000000f022\r\n");
        match &self.framing {
            WireFraming::Exact => head.push_str(&format!("Content-Length: {len}\r\n")),
            WireFraming::Declared(lengths) => {
                for declared in lengths {
                    head.push_str(&format!("Content-Length: {declared}\r\n"));
                }
            }
            WireFraming::Chunked(_) | WireFraming::ChunkLies => head.push_str("Transfer-Encoding: chunked\r\n"),
            WireFraming::CloseDelimited => head.push_str("Connection: close\r\n"),
            WireFraming::LengthAndChunked => {
                head.push_str(&format!("Content-Length: {len}\r\nTransfer-Encoding: chunked\r\n"));
            }
        }
        let mut pieces = Pieces::from_bytes(head);
        pieces.append(self.extra.clone());
        pieces.push(Bytes::from_static(b"\r\n"));
        pieces
    }
}

fn phrase(code: u16) -> &'static str {
    match code {
        100 => "Continue",
        101 => "Switching Protocols",
        102 => "Processing",
        103 => "Early Hints",
        200 => "OK",
        201 => "Created",
        204 => "No Content",
        304 => "Not Modified",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        409 => "Conflict",
        410 => "Gone",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        _ => "Fuzz",
    }
}

/// Writes what `wire` says; returns what to do with the connection.
async fn send<S: AsyncWrite + Unpin>(stream: &mut S, wire: &Wire) -> io::Result<After> {
    if let Some((code, count)) = wire.informational {
        let head = format!("HTTP/1.1 {code} {}\r\n\r\n", phrase(code));
        let mut heads = Pieces::default();
        heads.repeat(block_of(head.as_bytes()), head.len() * count);
        write_pieces(stream, &heads, None).await?;
    }
    for chunk in wire.raw.chunks() {
        stream.write_all(&chunk).await?;
    }
    if let Some(draft) = &wire.draft {
        let body = draft.body();
        let head = wire.head(draft, body.len());
        if let Cut::Head(keep) = wire.cut {
            let mut head = head;
            head.truncate(keep.min(head.len().saturating_sub(1)));
            write_pieces(stream, &head, None).await?;
            stream.flush().await?;
            return Ok(After::Abort);
        }
        write_pieces(stream, &head, None).await?;
        let mut body = body;
        let cut = match wire.cut {
            Cut::Body(keep) => {
                body.truncate(keep);
                true
            }
            _ => false,
        };
        match wire.framing {
            WireFraming::Chunked(max) => write_chunked(stream, &body, max, wire.trickle, !cut).await?,
            WireFraming::LengthAndChunked => write_chunked(stream, &body, CHUNK, wire.trickle, !cut).await?,
            WireFraming::ChunkLies => {
                let first = body.chunks().next().unwrap_or_default();
                stream.write_all(format!("{:x}\r\n", first.len() + 100).as_bytes()).await?;
                stream.write_all(&first).await?;
                stream.write_all(b"\r\n0\r\n\r\n").await?;
            }
            _ => write_pieces(stream, &body, wire.trickle).await?,
        }
        if cut {
            stream.flush().await?;
            return Ok(After::Abort);
        }
    }
    stream.flush().await?;
    Ok(wire.after)
}

async fn write_pieces<S: AsyncWrite + Unpin>(
    stream: &mut S,
    pieces: &Pieces,
    trickle: Option<(usize, Duration)>,
) -> io::Result<()> {
    for chunk in pieces.chunks() {
        match trickle {
            None => stream.write_all(&chunk).await?,
            Some((bytes, interval)) => {
                for at in (0..chunk.len()).step_by(bytes.max(1)) {
                    stream.write_all(&chunk[at..chunk.len().min(at + bytes)]).await?;
                    stream.flush().await?;
                    tokio::time::sleep(interval).await;
                }
            }
        }
    }
    Ok(())
}

async fn write_chunked<S: AsyncWrite + Unpin>(
    stream: &mut S,
    body: &Pieces,
    max: usize,
    trickle: Option<(usize, Duration)>,
    end: bool,
) -> io::Result<()> {
    for chunk in body.chunks() {
        for at in (0..chunk.len()).step_by(max.max(1)) {
            let piece = &chunk[at..chunk.len().min(at + max)];
            stream.write_all(format!("{:x}\r\n", piece.len()).as_bytes()).await?;
            stream.write_all(piece).await?;
            stream.write_all(b"\r\n").await?;
            if let Some((_, interval)) = trickle {
                stream.flush().await?;
                tokio::time::sleep(interval).await;
            }
        }
    }
    if end {
        stream.write_all(b"0\r\n\r\n").await?;
    }
    Ok(())
}

/// Reads and drops whatever comes until the client hangs up, or [`HOLD_OPEN`].
async fn await_hangup<S: AsyncRead + Unpin>(stream: &mut S) {
    let drain = async {
        let mut sink = [0u8; 4 * KIB];
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(HOLD_OPEN, drain).await;
}

// ------------------------------------------------------------------------------------------
// The server

/// A running fuzz SKR for one case on `<case ip>:<free port>`. Stopped on drop (see the module
/// docs).
pub struct FuzzSkr {
    addr: SocketAddr,
    ca_pem: String,
    shared: Arc<Shared>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FuzzSkr {
    /// Starts the server of `case` on [`FuzzCase::ip`] and a free port, playing `honest` with
    /// the case's hostile answers, serving the certificate of `tls`.
    ///
    /// # Errors
    /// Fails when the port, the runtime or the thread cannot be had.
    pub fn start(case: FuzzCase, honest: Arc<Honest>, tls: &FuzzTls) -> Result<Self> {
        let ip = case.ip();
        ensure!(ip.is_loopback(), "a fuzz SKR listens on loopback addresses only, not on {ip}");
        let listener = std::net::TcpListener::bind((ip, 0)).with_context(|| format!("failed to bind {ip}:0"))?;
        listener.set_nonblocking(true).context("failed to make the listener non-blocking")?;
        let addr = listener.local_addr().context("failed to read the listener address")?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("failed to build the fuzz SKR's tokio runtime")?;
        let listener = {
            let _in_runtime = runtime.enter();
            TcpListener::from_std(listener).context("failed to register the listener with the runtime")?
        };
        let shared = Arc::new(Shared::new(case, honest));
        let (shutdown_tx, shutdown_rx) = oneshot::channel();
        let thread_shared = Arc::clone(&shared);
        let acceptor = tls.acceptor.clone();
        let thread = std::thread::Builder::new()
            .name(format!("fuzz-skr-{}", addr.port()))
            .spawn(move || {
                // Dropping the runtime afterwards drops whatever task is left.
                runtime.block_on(accept_loop(listener, acceptor, thread_shared, shutdown_rx));
            })
            .context("failed to spawn the fuzz SKR thread")?;
        Ok(Self { addr, ca_pem: tls.ca_pem.clone(), shared, shutdown: Some(shutdown_tx), thread: Some(thread) })
    }

    /// The case it plays.
    pub fn case(&self) -> &FuzzCase {
        &self.shared.case
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://<ip>:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The PEM of the CA that signed the serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// A kubeconfig for this server with bearer `token`, shaped as
    /// [`HostileSkr::kubeconfig_with_token`](super::hostile::HostileSkr::kubeconfig_with_token)'s.
    pub fn kubeconfig_with_token(&self, token: &str) -> String {
        let name = format!("fuzz-{}", self.addr.port());
        render_kubeconfig(&name, &self.url(), &self.ca_pem, "fuzz", &token_credentials(token))
    }

    /// TCP connections accepted so far.
    pub fn connections(&self) -> usize {
        self.shared.connections.load(Ordering::SeqCst)
    }

    /// Requests read so far.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::SeqCst)
    }

    /// Connections whose handling panicked in the server: a bug of the fuzzer, which would
    /// look like a closed connection to the client, so tests should check it is 0.
    pub fn server_panics(&self) -> usize {
        self.shared.panics.load(Ordering::SeqCst)
    }

    /// The hostile answers sent so far, in order, each with the request it answered
    /// (`request 3 GET /apis/...: a Content-Length 17 bytes longer than the body`); at most
    /// the first 32, for the cases whose lists never end.
    pub fn fired(&self) -> Vec<String> {
        self.shared.state().log.clone()
    }
}

impl Drop for FuzzSkr {
    fn drop(&mut self) {
        drop(self.shutdown.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for FuzzSkr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FuzzSkr")
            .field("addr", &self.addr)
            .field("case", &self.shared.case.index)
            .field("requests", &self.requests())
            .finish_non_exhaustive()
    }
}

/// Accepts connections until `shutdown` fires (or its sender is dropped); then the connection
/// tasks are aborted with the [`JoinSet`].
async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    shared: Arc<Shared>,
    mut shutdown: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    shared.connections.fetch_add(1, Ordering::SeqCst);
                    let serving = AssertUnwindSafe(serve_connection(stream, acceptor.clone(), Arc::clone(&shared)));
                    let shared = Arc::clone(&shared);
                    connections.spawn(async move {
                        if serving.catch_unwind().await.is_err() {
                            shared.panics.fetch_add(1, Ordering::SeqCst);
                        }
                    });
                }
                // E.g. out of file descriptors; try again shortly.
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            },
        }
    }
}

async fn serve_connection(stream: TcpStream, acceptor: TlsAcceptor, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let Ok(Ok(mut stream)) = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await else {
        return;
    };
    let mut buf = Vec::new();
    loop {
        let request = match read_request(&mut stream, &mut buf).await {
            Ok(request) => request,
            Err(ReadError::Closed) => return,
            Err(ReadError::HeadTooLarge) => {
                shared.requests.fetch_add(1, Ordering::SeqCst);
                let draft =
                    Draft::json(431, status_value(431, "RequestHeaderFieldsTooLarge", "request header too large"));
                let mut wire = Wire::honest(draft);
                wire.after = After::Close;
                let _ = send(&mut stream, &wire).await;
                let _ = stream.shutdown().await;
                return;
            }
        };
        let index = shared.requests.fetch_add(1, Ordering::SeqCst);
        let wire = shared.answer(index, &request);
        match send(&mut stream, &wire).await {
            Ok(After::KeepAlive) => {}
            Ok(After::Close) => {
                let _ = stream.shutdown().await;
                return;
            }
            Ok(After::Abort) | Err(_) => return,
            Ok(After::AwaitHangup) => {
                await_hangup(&mut stream).await;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn honest() -> Honest {
        let copy = json!({"apiVersion": CATALOG_API_VERSION, "kind": "ModuleTemplate",
                          "metadata": {"name": "a-1.0.0", "labels": {MANAGED_BY_LABEL: MANAGED_BY_VALUE}},
                          "spec": {"moduleName": "a", "version": "1.0.0"}});
        Honest {
            namespace: "kyma-system".to_owned(),
            crds: BTreeMap::new(),
            copies: [("moduletemplates".to_owned(), vec![copy])].into(),
        }
    }

    fn request(method: &str, target: &str) -> Request {
        Request { method: method.to_owned(), target: target.to_owned(), ..Request::default() }
    }

    #[test]
    fn cases_are_a_function_of_seed_and_index() {
        for index in 0..200 {
            let (a, b) = (FuzzCase::new(7, index), FuzzCase::new(7, index));
            assert_eq!(a.description(), b.description());
            assert!(a.is_hostile(), "{a}");
            assert!(!FuzzCase::honest(7, index).is_hostile());
            assert!(a.ip().is_loopback());
        }
        assert_ne!(FuzzCase::new(7, 1).description(), FuzzCase::new(8, 1).description());
    }

    #[test]
    fn placeholders_become_fills_of_the_exact_length() {
        let mut draft = Draft::json(200, Value::Null);
        let name = draft.fill(Fill::Escapes, 1000);
        let causes =
            draft.placeholder(Splice::Elements(whole_units(&CAUSES_BLOCK, CAUSE_UNIT.len(), 3 * CAUSE_UNIT.len())));
        draft.json = Some(json!({"name": name, "causes": [causes, {"last": true}]}));
        let body = draft.body().to_vec();
        let parsed: Value = serde_json::from_slice(&body).expect("valid JSON");
        assert_eq!(parsed["causes"].as_array().map(Vec::len), Some(4));
        let name = parsed["name"].as_str().expect("a string");
        assert!(name.contains('\u{1b}') && name.contains('\n'), "{name:?}");
    }

    #[test]
    fn huge_fills_stay_lazy_and_bounded() {
        let mut draft = Draft::json(200, Value::Null);
        let fills: Vec<Value> = (0..4).map(|_| draft.fill(Fill::Plain, MAX_HUGE)).collect();
        draft.json = Some(json!({"fills": fills}));
        let body = draft.body();
        assert_eq!(body.len(), MAX_BODY, "cut at the bound");
        assert!(body.0.len() < 20, "a few pieces, not copies");
        assert!(body.chunks().all(|c| c.len() <= CHUNK));
    }

    #[test]
    fn lists_page_honestly_and_loop_when_told_to() {
        let mut case = FuzzCase::honest(1, 3);
        case.shape.page_size = 1;
        case.shape.listed = 1;
        case.shape.orphans = 2;
        case.shape.foreign = 0;
        let shared = Shared::new(case.clone(), Arc::new(honest()));
        let list = |shared: &Shared, token: Option<&str>| {
            let target = match token {
                None => {
                    "/apis/operator.kyma-project.io/v1beta2/namespaces/kyma-system/moduletemplates?limit=50".to_owned()
                }
                Some(t) => format!(
                    "/apis/operator.kyma-project.io/v1beta2/namespaces/kyma-system/moduletemplates?limit=50&continue={t}"
                ),
            };
            let body = shared.answer(0, &request("GET", &target)).draft.expect("an answer").body().to_vec();
            serde_json::from_slice::<Value>(&body).expect("JSON")
        };
        let first = list(&shared, None);
        assert_eq!(first["items"][0]["metadata"]["name"], "a-1.0.0");
        assert_eq!(first["metadata"]["continue"], "fuzz-1");
        let last = list(&shared, Some("fuzz-2"));
        assert_eq!(last["items"][0]["metadata"]["name"], "fuzz-orphan-1-0.0.1");
        assert!(last["metadata"].get("continue").is_none());

        case.lists = ListMode::Loops;
        let looping = Shared::new(case, Arc::new(honest()));
        assert_eq!(list(&looping, Some("fuzz-1"))["metadata"]["continue"], "fuzz-1");
    }

    #[test]
    fn requests_are_classified_by_method_and_path() {
        let base = "/apis/operator.kyma-project.io/v1beta2/namespaces/kyma-system";
        assert_eq!(classify(&request("GET", "/api/v1/namespaces/kyma-system")), Class::NamespaceGet);
        assert_eq!(
            classify(&request("PATCH", &format!("{base}/moduletemplates/a?fieldManager=catalog-sync&force=true"))),
            Class::Apply { plural: "moduletemplates".into(), name: "a".into() }
        );
        assert!(matches!(
            classify(&request("GET", &format!("{base}/modulereleasemetas?limit=500"))),
            Class::List { .. }
        ));
        assert_eq!(classify(&request("POST", "/")), Class::Other);
    }

    #[tokio::test]
    async fn requests_are_read_with_either_framing_and_leave_the_rest() {
        let bytes = b"PATCH /x HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET /y HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n";
        let mut stream = &bytes[..];
        let mut buf = Vec::new();
        let Ok(first) = read_request(&mut stream, &mut buf).await else { panic!("a first request") };
        assert_eq!((first.method.as_str(), first.target.as_str(), first.body.as_slice()), ("PATCH", "/x", &b"abc"[..]));
        let Ok(second) = read_request(&mut stream, &mut buf).await else { panic!("a second request") };
        assert_eq!((second.target.as_str(), second.body.as_slice()), ("/y", &b"hi"[..]));
        assert!(matches!(read_request(&mut stream, &mut buf).await, Err(ReadError::Closed)));
    }
}
