//! One etcd per test binary, shared by every apiserver of that binary (each under its own
//! `--etcd-prefix`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

use super::process::{ManagedProcess, TestDir, free_port, k8s_binary};

/// How long etcd may take to answer `/health`. It is ready in well under a second on an
/// idle machine; the slack is for a machine busy compiling.
pub const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// A running etcd.
pub struct Etcd {
    process: ManagedProcess,
    client_port: u16,
    dir: TestDir,
}

impl Etcd {
    /// Starts etcd (binary from `TEST_ASSET_ETCD` or `KUBEBUILDER_ASSETS`) on free ports with
    /// its data and log in a new directory under `parent` (or the system temp dir), and
    /// waits until `/health` answers 200.
    ///
    /// # Errors
    /// Fails when the binary is missing, the process cannot start, or it is not healthy
    /// within [`ETCD_READY_TIMEOUT`] (the message carries the tail of its log).
    pub async fn start(parent: Option<&Path>) -> Result<Self> {
        let bin = k8s_binary("TEST_ASSET_ETCD", "etcd")?;
        let dir = TestDir::new("etcd", parent)?;
        let client_port = free_port()?;
        let peer_port = free_port()?;
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut cmd = Command::new(&bin);
        cmd.arg(format!("--data-dir={}", dir.path().join("data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=default={peer_url}"))
            .arg("--unsafe-no-fsync")
            .arg("--log-level=warn");
        let process = ManagedProcess::spawn("etcd", cmd, &dir.path().join("etcd.log"))?;
        let mut etcd = Self { process, client_port, dir };
        etcd.wait_healthy().await?;
        Ok(etcd)
    }

    /// The client URL, for `--etcd-servers`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// etcd's directory (data and `etcd.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The etcd process.
    pub fn process(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }

    async fn wait_healthy(&mut self) -> Result<()> {
        let start = Instant::now();
        loop {
            if let Some(status) = self.process.exit_status() {
                bail!(
                    "etcd exited with {status} before it became healthy; log {}:\n{}",
                    self.process.log_path().display(),
                    self.process.log_tail(30)
                );
            }
            if health_ok(self.client_port).await {
                return Ok(());
            }
            if start.elapsed() > ETCD_READY_TIMEOUT {
                bail!(
                    "timed out after {}s waiting for etcd to answer GET /health with 200; log {}:\n{}",
                    ETCD_READY_TIMEOUT.as_secs(),
                    self.process.log_path().display(),
                    self.process.log_tail(30)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// One plain HTTP/1.0 `GET /health`; true on status 200. (Readiness-based I/O, because
/// the crate's tokio has no `io-util` feature.)
async fn health_ok(port: u16) -> bool {
    let attempt = async {
        let stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let mut request: &[u8] = b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
        while !request.is_empty() {
            stream.writable().await?;
            match stream.try_write(request) {
                Ok(n) => request = &request[n..],
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        let mut response = Vec::new();
        let mut buf = [0u8; 1024];
        loop {
            stream.readable().await?;
            match stream.try_read(&mut buf) {
                Ok(0) => break,
                Ok(n) => response.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
        Ok(response.starts_with(b"HTTP/1.0 200") || response.starts_with(b"HTTP/1.1 200"))
    };
    tokio::time::timeout(Duration::from_secs(2), attempt).await.ok().and_then(Result::ok).unwrap_or(false)
}
