//! Ctrl-C (SIGINT) and SIGTERM, received as often as they come: the first stops `local-up`
//! gracefully, another one during the shutdown hurries it.

use anyhow::{Context as _, Result};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGINT and SIGTERM. Once this exists, neither kills the process any more.
pub struct Interrupts {
    int: Signal,
    term: Signal,
}

impl Interrupts {
    /// Starts listening for both signals.
    ///
    /// # Errors
    /// Fails when a signal handler cannot be installed.
    pub fn new() -> Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt()).context("failed to listen for SIGINT")?,
            term: signal(SignalKind::terminate()).context("failed to listen for SIGTERM")?,
        })
    }

    /// Waits for the next SIGINT or SIGTERM. Cancel-safe: a signal that arrives while nobody
    /// waits is delivered to the next call.
    pub async fn recv(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
        }
    }
}
