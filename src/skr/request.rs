//! Requests to one SKR, with its answers read within bounds.
//!
//! An SKR is customer-controlled, and so is everything it answers. kube's request helpers
//! read a body whole, whatever its size, and log an unparsable error body in full; so SKR
//! requests go through [`SkrClient`] instead, which:
//!
//! - refuses a body over `--skr-max-response-size` (by its Content-Length before reading,
//!   else when the limit is crossed: the client's body is capped as well, see
//!   [`crate::skr::access`]), with [`ResponseTooLarge`];
//! - reads at most [`MAX_ERROR_BODY`] of an error answer, keeps of its `Status` only the
//!   code, reason and message, each cut short and stripped of control characters;
//! - cuts parse errors (serde quotes the offending value) the same way;
//! - counts every byte it reads, error bodies included, against the budget of the sync the
//!   client was built for ([`SyncBudget`], `--skr-sync-budget`): once a sync has read that
//!   much from its SKR, every further read fails with [`BudgetExceeded`], whatever the size
//!   of each single answer.
//!
//! Time is bounded by the caller (every SKR request runs under the request timeout, every
//! sync under the sync timeout), so a body trickled or never ending costs at most the
//! timeout and the size limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use http_body_util::BodyExt as _;
use kube::Client;
use kube::core::Status;
use serde::de::DeserializeOwned;

use crate::text::bounded;

/// Most bytes of an error answer that are read: a Kubernetes `Status` is well under 4 KiB.
pub const MAX_ERROR_BODY: usize = 64 * 1024;

/// Most characters of SKR-sent text (a `Status` message, a parse error) kept in an error.
pub const MAX_QUOTED: usize = 256;

/// An SKR answer larger than the limit; the request fails with this as its
/// [`kube::Error::Service`] source.
#[derive(Debug, thiserror::Error)]
#[error("the SKR's answer is larger than {limit} bytes (--skr-max-response-size)")]
pub struct ResponseTooLarge {
    /// The limit in bytes.
    pub limit: usize,
}

/// An SKR that lists more objects of a kind than any catalog has (a list that never ends);
/// the sync fails with this as its [`kube::Error::Service`] source, as too large.
#[derive(Debug, thiserror::Error)]
#[error("the SKR listed more than {limit} objects of one kind")]
pub struct TooManyObjects {
    /// The most objects accepted.
    pub limit: usize,
}

/// A sync that read more than its budget from its SKR; the request fails with this as its
/// [`kube::Error::Service`] source.
#[derive(Debug, thiserror::Error)]
#[error("the SKR sent more than {budget} bytes in one sync (--skr-sync-budget)")]
pub struct BudgetExceeded {
    /// The budget in bytes.
    pub budget: usize,
}

/// An SKR answer with a field no real apiserver sends: checked when the answer is decoded,
/// before anything of it is kept. Names the field and what is wrong, never its value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the SKR's answer has an invalid {field}: {problem}")]
pub struct InvalidAnswer {
    /// The field, as a JSON path (`items[].metadata.name`).
    pub field: &'static str,
    /// What is wrong with it (`longer than 253 bytes`).
    pub problem: &'static str,
}

impl InvalidAnswer {
    /// As the [`kube::Error`] of the request whose answer it was.
    pub fn into_kube(self) -> kube::Error {
        kube::Error::Service(Box::new(self))
    }
}

/// Whether `err` is an answer with an invalid field ([`InvalidAnswer`]).
pub fn is_invalid_answer(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Service(e) if e.is::<InvalidAnswer>())
}

/// Whether `err` is a sync over its byte budget ([`BudgetExceeded`]).
pub fn is_over_budget(err: &kube::Error) -> bool {
    match err {
        kube::Error::Service(e) => e.is::<BudgetExceeded>(),
        _ => false,
    }
}

/// What one sync may still read from its SKR: every [`SkrClient`] clone of one sync shares
/// it, so all pages, kinds, applies and error bodies of that sync count together.
#[derive(Debug, Clone)]
pub struct SyncBudget {
    total: usize,
    left: Arc<AtomicUsize>,
}

impl SyncBudget {
    /// A budget of `bytes`.
    pub fn new(bytes: usize) -> Self {
        Self { total: bytes, left: Arc::new(AtomicUsize::new(bytes)) }
    }

    /// Bytes that may still be read.
    pub fn left(&self) -> usize {
        self.left.load(Ordering::Relaxed)
    }

    /// Bytes read so far.
    pub fn spent(&self) -> usize {
        self.total - self.left()
    }

    /// Counts `n` bytes read (never below zero).
    fn spend(&self, n: usize) {
        let _ = self.left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| Some(left.saturating_sub(n)));
    }

    fn exceeded(&self) -> kube::Error {
        kube::Error::Service(Box::new(BudgetExceeded { budget: self.total }))
    }
}

/// Whether `err` is, or is caused by, an answer over the size limit.
pub fn is_too_large(err: &kube::Error) -> bool {
    match err {
        kube::Error::Service(e) => {
            e.is::<ResponseTooLarge>()
                || e.is::<TooManyObjects>()
                || e.is::<http_body_util::LengthLimitError>()
                || is_cause_too_large(&**e)
        }
        _ => false,
    }
}

fn is_cause_too_large(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = err.source();
    while let Some(c) = cause {
        if c.is::<ResponseTooLarge>() || c.is::<http_body_util::LengthLimitError>() {
            return true;
        }
        cause = c.source();
    }
    false
}

fn too_large(limit: usize) -> kube::Error {
    kube::Error::Service(Box::new(ResponseTooLarge { limit }))
}

/// A client of one SKR for one sync.
#[derive(Clone)]
pub struct SkrClient {
    client: Client,
    max_response: usize,
    budget: SyncBudget,
}

impl SkrClient {
    /// Wraps `client`, whose answers may be at most `max_response` bytes each, and at most
    /// `budget` bytes all together.
    pub fn new(client: Client, max_response: usize, budget: usize) -> Self {
        Self { client, max_response, budget: SyncBudget::new(budget) }
    }

    /// What this client's sync may still read.
    pub fn budget(&self) -> &SyncBudget {
        &self.budget
    }

    /// The kube client underneath, for callers that accept kube's unbounded reads (the
    /// fleet harness's lifecycle-manager baseline does, as lifecycle-manager does).
    pub fn kube(&self) -> &Client {
        &self.client
    }

    /// Sends `request` and parses the answer as JSON.
    ///
    /// # Errors
    /// As [`SkrClient::bytes`], or a [`kube::Error::SerdeError`] with a bounded message.
    pub async fn json<T: DeserializeOwned>(&self, request: http::Request<Vec<u8>>) -> Result<T, kube::Error> {
        self.json_of(request.map(kube::client::Body::from)).await
    }

    /// [`SkrClient::json`] for a request whose body is already a [`kube::client::Body`] (a
    /// shared apply body).
    ///
    /// # Errors
    /// As [`SkrClient::json`].
    pub async fn json_of<T: DeserializeOwned>(
        &self,
        request: http::Request<kube::client::Body>,
    ) -> Result<T, kube::Error> {
        let body = self.read(request).await?;
        serde_json::from_slice(&body).map_err(bounded_serde_error)
    }

    /// Sends `request` and reads the whole answer.
    ///
    /// # Errors
    /// The transport's error; [`kube::Error::Api`] with a bounded `Status` for an error
    /// answer; [`ResponseTooLarge`] (as a [`kube::Error::Service`]) for an answer over the
    /// limit.
    pub async fn bytes(&self, request: http::Request<Vec<u8>>) -> Result<Vec<u8>, kube::Error> {
        self.read(request.map(kube::client::Body::from)).await
    }

    async fn read(&self, request: http::Request<kube::client::Body>) -> Result<Vec<u8>, kube::Error> {
        if self.budget.left() == 0 {
            return Err(self.budget.exceeded());
        }
        let response = self.client.send(request).await?;
        let code = response.status();
        let declared = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let mut body = response.into_body();
        let left = self.budget.left();
        // Only a 2xx is an answer; a 1xx or 3xx as the final answer (no apiserver sends one
        // to these requests) is an error too, so a redirect cannot end a list as if complete.
        if !code.is_success() {
            let (text, complete) = read_prefix(&mut body, MAX_ERROR_BODY.min(left)).await;
            self.budget.spend(text.len());
            if matches!(complete, Ok(false)) && left < MAX_ERROR_BODY {
                return Err(self.budget.exceeded());
            }
            return Err(kube::Error::Api(Box::new(error_status(code.as_u16(), &text))));
        }
        // What this answer may be: the size limit, or less when the sync's budget is nearly
        // spent (then a larger answer fails the sync as over budget, not as too large).
        let (limit, over) = if left < self.max_response {
            (left, self.budget.exceeded())
        } else {
            (self.max_response, too_large(self.max_response))
        };
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(over);
        }
        let (data, complete) = read_prefix(&mut body, limit).await;
        self.budget.spend(data.len());
        match complete {
            Ok(true) => Ok(data),
            Ok(false) => Err(over),
            Err(err) if is_too_large(&err) => Err(over),
            Err(err) => Err(err),
        }
    }
}

/// Reads at most `max` bytes of `body`. Returns them, and whether the body ended within
/// them (`Ok(false)`: there was more), or the error that ended the read.
async fn read_prefix(body: &mut kube::client::Body, max: usize) -> (Vec<u8>, Result<bool, kube::Error>) {
    let mut data = Vec::new();
    loop {
        match body.frame().await {
            None => return (data, Ok(true)),
            Some(Err(err)) => return (data, Err(err)),
            Some(Ok(frame)) => {
                if let Ok(chunk) = frame.into_data() {
                    let room = max - data.len();
                    if chunk.len() > room {
                        data.extend_from_slice(&chunk[..room]);
                        return (data, Ok(false));
                    }
                    data.extend_from_slice(&chunk);
                }
            }
        }
    }
}

/// The `Status` of an error answer, keeping only bounded, printable text.
fn error_status(code: u16, body: &[u8]) -> Status {
    match serde_json::from_slice::<Status>(body) {
        Ok(status) => Status {
            status: status.status,
            code,
            message: bounded(&status.message, MAX_QUOTED),
            metadata: None,
            reason: bounded(&status.reason, 64),
            details: None,
        },
        Err(_) => {
            let text = String::from_utf8_lossy(&body[..body.len().min(4 * MAX_QUOTED)]);
            let message = format!("a body that is not a Status: {}", bounded(&text, 128));
            Status::failure(&message, "").with_code(code)
        }
    }
}

/// A parse error with its quoted input cut short (serde quotes the value it did not expect).
pub fn bounded_serde_error(err: serde_json::Error) -> kube::Error {
    let message = bounded(&err.to_string(), MAX_QUOTED);
    kube::Error::SerdeError(<serde_json::Error as serde::de::Error>::custom(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_bodies_keep_only_bounded_printable_text() {
        let long = format!("\u{1b}[31mboom\n{}", "x".repeat(10_000));
        let body = serde_json::json!({"kind": "Status", "code": 500, "reason": "Internal\nError", "message": long,
            "details": {"causes": [{"message": "y".repeat(10_000)}]}});
        let status = error_status(500, body.to_string().as_bytes());
        assert_eq!(status.code, 500);
        assert!(status.message.starts_with(" [31mboom x"), "{}", status.message);
        assert!(status.message.chars().count() <= MAX_QUOTED + 3);
        assert_eq!(status.reason, "Internal Error");
        assert!(status.details.is_none());

        let status = error_status(502, format!("<html>\n{}", "z".repeat(100_000)).as_bytes());
        assert_eq!(status.code, 502);
        assert!(status.message.len() < 300, "{}", status.message);
        assert!(!status.message.contains('\n'));
    }

    #[test]
    fn parse_errors_are_cut_short() {
        let value = format!("\"{}\"", "s".repeat(100_000));
        let err = serde_json::from_str::<u64>(&value).expect_err("a string is not a number");
        assert!(err.to_string().len() > 100_000, "serde quotes the value");
        let bounded = bounded_serde_error(err).to_string();
        assert!(bounded.len() < 400, "{}", bounded.len());
    }

    /// A client whose SKR answers every request with `code` and a body of `len` bytes.
    fn answering(code: u16, len: usize, max_response: usize, budget: usize) -> SkrClient {
        let service = tower::service_fn(move |_: http::Request<kube::client::Body>| async move {
            let response = http::Response::builder()
                .status(code)
                .body(kube::client::Body::from(vec![b' '; len]))
                .expect("a response");
            Ok::<_, kube::Error>(response)
        });
        SkrClient::new(Client::new(service, "default"), max_response, budget)
    }

    fn get() -> http::Request<Vec<u8>> {
        http::Request::get("/api/v1/namespaces").body(Vec::new()).expect("a request")
    }

    #[tokio::test]
    async fn every_answer_of_a_sync_counts_against_one_budget() {
        // Ten answers of 100 bytes each, each under the size limit, in a budget of 450 bytes.
        let client = answering(200, 100, 1_000, 450);
        let clone = client.clone();
        for _ in 0..4 {
            clone.bytes(get()).await.expect("within the budget");
        }
        assert_eq!(client.budget().spent(), 400, "clones share the budget");
        let err = client.bytes(get()).await.expect_err("the fifth answer crosses the budget");
        assert!(is_over_budget(&err), "{err}");
        assert!(!is_too_large(&err), "over budget is not one answer too large");
        assert!(err.to_string().contains("450 bytes in one sync"), "{err}");
        assert_eq!(client.budget().left(), 0);
        let err = client.bytes(get()).await.expect_err("nothing more once spent");
        assert!(is_over_budget(&err));

        // Error bodies count too.
        let client = answering(500, 300, 1_000, 450);
        let err = client.bytes(get()).await.expect_err("a 500");
        assert!(matches!(&err, kube::Error::Api(s) if s.code == 500), "{err}");
        assert_eq!(client.budget().spent(), 300);
        let err = client.bytes(get()).await.expect_err("the second error body crosses the budget");
        assert!(is_over_budget(&err), "{err}");

        // One answer over the size limit is too large, whatever the budget.
        let client = answering(200, 2_000, 1_000, 1 << 20);
        assert!(is_too_large(&client.bytes(get()).await.expect_err("too large")));
    }

    #[tokio::test]
    async fn only_a_2xx_is_an_answer() {
        for code in [101, 204, 302, 304, 404, 500] {
            let result = answering(code, 10, 1_000, 1_000).bytes(get()).await;
            match code {
                204 => assert!(result.is_ok(), "{code}: {result:?}"),
                _ => assert!(matches!(&result, Err(kube::Error::Api(s)) if s.code == code), "{code}: {result:?}"),
            }
        }
    }

    #[tokio::test]
    async fn too_large_is_recognised_through_the_client_error() {
        assert!(is_too_large(&too_large(10)));
        let capped = http_body_util::Limited::new(http_body_util::Full::new(&[0u8; 20][..]), 10);
        let err = capped.collect().await.map(|_| ()).expect_err("over the limit");
        assert!(is_too_large(&kube::Error::Service(err)));
        assert!(!is_too_large(&kube::Error::Service("other".into())));
    }
}
