//! Requests to the KCP, each bounded by `--kcp-request-timeout`. kube's client has no read
//! timeout (its watches are long-lived), so a stalled KCP connection would otherwise hang a
//! Lease renewal, a Lease write, an access Secret read or a condition write for as long as
//! TCP keeps the connection: the replica would stay fenced after the network healed. A
//! request cut off here drops its connection; the next one opens a new one. Also: when a
//! cache of the KCP has finished its first list ([`until_ready`]).

use kube::runtime::reflector::Store;
use std::time::Duration;

/// Default of `--kcp-request-timeout`.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// `request`, failed with a timeout error when it has not answered within `timeout`.
///
/// # Errors
/// The request's error, or [`kube::Error::Service`] with an [`std::io::ErrorKind::TimedOut`]
/// error.
pub async fn bounded<T>(
    timeout: Duration,
    request: impl Future<Output = Result<T, kube::Error>>,
) -> Result<T, kube::Error> {
    match tokio::time::timeout(timeout, request).await {
        Ok(result) => result,
        Err(_) => Err(timed_out(timeout)),
    }
}

/// The error of a KCP request that did not answer within `timeout`.
pub fn timed_out(timeout: Duration) -> kube::Error {
    kube::Error::Service(Box::new(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("the KCP did not answer within {timeout:?} (--kcp-request-timeout)"),
    )))
}

/// Waits until a store finished its first list. A store's readiness signal wakes only its
/// most recent waiter, and several tasks wait on the same stores, so poll it again
/// periodically rather than sleeping on it.
pub async fn until_ready<K>(store: &Store<K>) -> bool
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    loop {
        match tokio::time::timeout(std::time::Duration::from_millis(200), store.wait_until_ready()).await {
            Ok(result) => return result.is_ok(),
            Err(_) => continue,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_request_that_hangs_fails_at_the_timeout() {
        let hang = std::future::pending::<Result<(), kube::Error>>();
        let started = tokio::time::Instant::now();
        let err = bounded(Duration::from_secs(5), hang).await.expect_err("cut off");
        assert_eq!(started.elapsed(), Duration::from_secs(5));
        assert!(err.to_string().contains("did not answer within 5s"), "{err}");
        assert_eq!(bounded(Duration::from_secs(5), async { Ok::<_, kube::Error>(7) }).await.ok(), Some(7));
    }
}
