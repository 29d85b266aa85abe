//! The one plain-HTTP client of the test environment and the harnesses: a request on a fresh
//! loopback connection (`Connection: close`), for probes, `/metrics` scrapes and the admin
//! endpoints of the simulator and the baseline. No TLS, no keep-alive, bounded in time.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// How long one request may take, connection to last byte, unless the caller says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// One HTTP/1.1 request to `addr` on a fresh connection, with an optional JSON body. Returns the
/// status code and the body (chunked bodies are decoded).
///
/// # Errors
/// When the connection fails, the answer is not HTTP or `timeout` passes first.
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<(u16, Vec<u8>)> {
    let exchange = async {
        let mut stream =
            tokio::net::TcpStream::connect(addr).await.with_context(|| format!("failed to connect to {addr}"))?;
        let body = body.unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body).await?;
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await?;
        parse_response(&buf)
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .with_context(|| format!("{method} http://{addr}{path} timed out after {timeout:?}"))?
}

/// `GET path` from `addr`; returns the status code and the body as text.
///
/// # Errors
/// As [`request`], with [`DEFAULT_TIMEOUT`].
pub async fn get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let (status, body) = request(addr, "GET", path, None, DEFAULT_TIMEOUT).await?;
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// `GET path` from `127.0.0.1:<port>`; see [`get`].
///
/// # Errors
/// As [`get`].
pub async fn get_local(port: u16, path: &str) -> Result<(u16, String)> {
    get(SocketAddr::from(([127, 0, 0, 1], port)), path).await
}

/// Status and body of a raw HTTP/1.x response.
fn parse_response(buf: &[u8]) -> Result<(u16, Vec<u8>)> {
    let split = buf.windows(4).position(|w| w == b"\r\n\r\n").context("no end of the HTTP head")?;
    let head = String::from_utf8_lossy(&buf[..split]).to_ascii_lowercase();
    if !head.starts_with("http/1.") {
        bail!("not an HTTP/1 response");
    }
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("no HTTP status")?;
    let raw = &buf[split + 4..];
    let body = if head.contains("transfer-encoding: chunked") { dechunk(raw)? } else { raw.to_vec() };
    Ok((status, body))
}

fn dechunk(mut raw: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let eol = raw.windows(2).position(|w| w == b"\r\n").context("truncated chunk size")?;
        let size_text = String::from_utf8_lossy(&raw[..eol]);
        let size = usize::from_str_radix(size_text.split(';').next().unwrap_or_default().trim(), 16)
            .context("invalid chunk size")?;
        raw = &raw[eol + 2..];
        if size == 0 {
            return Ok(out);
        }
        let chunk = raw.get(..size).context("truncated chunk")?;
        out.extend_from_slice(chunk);
        raw = raw.get(size + 2..).unwrap_or_default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_and_chunked_bodies_are_read() {
        let (status, body) = parse_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").expect("plain");
        assert_eq!((status, body.as_slice()), (200, b"ok".as_slice()));
        let chunked =
            b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let (status, body) = parse_response(chunked).expect("chunked");
        assert_eq!((status, body.as_slice()), (503, b"abcde".as_slice()));
    }

    #[test]
    fn a_response_that_is_not_http_is_an_error() {
        assert!(parse_response(b"garbage").is_err());
        assert!(parse_response(b"SSH-2.0\r\n\r\n").is_err());
        assert!(parse_response(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n").is_err());
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let _held = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            std::future::pending::<()>().await;
            drop(stream);
        });
        let err = request(addr, "GET", "/", None, Duration::from_millis(200)).await.expect_err("must time out");
        assert!(format!("{err:#}").contains("timed out"), "{err:#}");
    }
}
