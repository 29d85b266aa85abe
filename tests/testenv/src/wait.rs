//! Polling with a deadline instead of sleeping and hoping.

use std::future::Future;
use std::time::{Duration, Instant};

/// How often conditions are re-checked.
pub const POLL_INTERVAL: Duration = Duration::from_millis(150);

/// What a condition check returns: `bool` (done or not) or `Option<T>` (done with a value).
pub trait Outcome {
    /// The value a met condition yields.
    type Output;
    /// `Some` when the condition is met.
    fn into_met(self) -> Option<Self::Output>;
}

impl Outcome for bool {
    type Output = ();
    fn into_met(self) -> Option<()> {
        self.then_some(())
    }
}

impl<T> Outcome for Option<T> {
    type Output = T;
    fn into_met(self) -> Option<T> {
        self
    }
}

/// Polls `check` every [`POLL_INTERVAL`] until it returns `true` or `Some(value)`, and returns
/// the value. The check runs at least once, also with a zero timeout.
///
/// # Errors
/// `"timed out after Xs waiting for <description>"`.
pub async fn wait_until<F, Fut, R>(timeout: Duration, description: &str, mut check: F) -> anyhow::Result<R::Output>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
    R: Outcome,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await.into_met() {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {}s waiting for {description}", timeout.as_secs_f64());
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// [`wait_until`] for tests: panics with `"timed out after Xs waiting for <description>"`.
///
/// ```ignore
/// let mt = await_condition(Duration::from_secs(10), "btp-operator-1.1.0 in skr-a", || async {
///     api.get_opt("btp-operator-1.1.0").await.ok().flatten()
/// }).await;
/// ```
///
/// # Panics
/// On timeout.
pub async fn await_condition<F, Fut, R>(timeout: Duration, description: &str, check: F) -> R::Output
where
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
    R: Outcome,
{
    match wait_until(timeout, description, check).await {
        Ok(value) => value,
        Err(e) => panic!("{e}"),
    }
}
