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
//! - cuts parse errors (serde quotes the offending value) the same way.
//!
//! Time is bounded by the caller (every SKR request runs under the request timeout), so a
//! body trickled or never ending costs at most the timeout and the size limit.

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
}

impl SkrClient {
    /// Wraps `client`, whose answers may be at most `max_response` bytes.
    pub fn new(client: Client, max_response: usize) -> Self {
        Self { client, max_response }
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
        let response = self.client.send(request).await?;
        let code = response.status();
        let declared = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let mut body = response.into_body();
        if code.is_client_error() || code.is_server_error() {
            let (text, _) = read_prefix(&mut body, MAX_ERROR_BODY).await;
            return Err(kube::Error::Api(Box::new(error_status(code.as_u16(), &text))));
        }
        if declared.is_some_and(|n| n > self.max_response as u64) {
            return Err(too_large(self.max_response));
        }
        let (data, complete) = read_prefix(&mut body, self.max_response).await;
        match complete {
            Ok(true) => Ok(data),
            Ok(false) => Err(too_large(self.max_response)),
            Err(err) if is_too_large(&err) => Err(too_large(self.max_response)),
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

    #[tokio::test]
    async fn too_large_is_recognised_through_the_client_error() {
        assert!(is_too_large(&too_large(10)));
        let capped = http_body_util::Limited::new(http_body_util::Full::new(&[0u8; 20][..]), 10);
        let err = capped.collect().await.map(|_| ()).expect_err("over the limit");
        assert!(is_too_large(&kube::Error::Service(err)));
        assert!(!is_too_large(&kube::Error::Service("other".into())));
    }
}
