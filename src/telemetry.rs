//! Logging: a tracing subscriber with an EnvFilter, plain or JSON; `log` records (from
//! kube-leader-election) are bridged into it.

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Why logging could not be set up. Each says what its cause says, as before it had a type.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `--log-filter` does not parse.
    #[error(transparent)]
    Filter(#[from] tracing_subscriber::filter::ParseError),
    /// The global subscriber could not be installed (one already is).
    #[error(transparent)]
    Install(Box<dyn std::error::Error + Send + Sync>),
}

/// Installs the global subscriber.
///
/// # Errors
/// [`TelemetryError::Filter`] when the filter does not parse, [`TelemetryError::Install`]
/// when a subscriber is already installed.
pub fn init(format: LogFormat, filter: &str) -> Result<(), TelemetryError> {
    let filter = EnvFilter::try_new(filter)?;
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
    }
    .map_err(TelemetryError::Install)
}
