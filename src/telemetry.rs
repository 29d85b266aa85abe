//! Logging: a tracing subscriber with an EnvFilter, plain or JSON; `log` records (from
//! kube-leader-election) are bridged into it.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber.
///
/// # Errors
/// Fails when the filter does not parse or a subscriber is already installed.
pub fn init(format: LogFormat, filter: &str) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let filter = EnvFilter::try_new(filter)?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
    }
}
