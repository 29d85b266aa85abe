//! Which labels of a Kyma the Kyma cache keeps. Every replica caches every Kyma of the fleet,
//! and a Kyma's labels (ten or more, most of them IDs) are the largest part of its cached
//! copy. The controller reads only a few of them: the beta, internal and
//! skip-reconciliation flags, and the keys the catalog's `kymaSelector`s name. The cache keeps
//! those keys and drops the rest.
//!
//! The keys a selector names are known only once the catalog is: the Kyma watch starts when
//! the first catalog is published, trimming with the keys that catalog wants. When a later
//! catalog names a key the cache does not keep, the wanted keys grow, and the Kyma watch lists
//! again, trimming with the larger set. Until that list is complete, a reconcile that would
//! read a key the cache does not hold waits ([`KymaLabelKeys::covers`]): a selector evaluated
//! on a label that was dropped would be evaluated on the wrong labels. The wanted keys never
//! shrink while the replica runs: a key kept for nothing costs memory, not a list.

use std::collections::BTreeSet;
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream};
use tokio::sync::watch;

use crate::api::{BETA_LABEL, INTERNAL_LABEL, SKIP_RECONCILIATION_LABEL};

/// A set of label keys, shared.
pub type Keys = Arc<BTreeSet<String>>;

/// The label keys the Kyma cache should keep (wanted) and the ones it holds (listed), shared
/// by the catalog publisher, the Kyma watch and the controller.
#[derive(Clone)]
pub struct KymaLabelKeys {
    wanted: Arc<watch::Sender<Option<Keys>>>,
    listed: Arc<watch::Sender<Option<Keys>>>,
}

impl Default for KymaLabelKeys {
    fn default() -> Self {
        Self::new()
    }
}

impl KymaLabelKeys {
    /// No keys wanted yet: the Kyma watch waits for the first [`want`](Self::want).
    pub fn new() -> Self {
        Self { wanted: Arc::new(watch::channel(None).0), listed: Arc::new(watch::channel(None).0) }
    }

    /// Wants the flags and `selector_keys` (those of a catalog about to be published) kept.
    /// Returns whether that grew the wanted keys, so the Kyma watch lists again (the first
    /// call always does: it starts the watch).
    pub fn want<'a>(&self, selector_keys: impl IntoIterator<Item = &'a str>) -> bool {
        let fixed = [BETA_LABEL, INTERNAL_LABEL, SKIP_RECONCILIATION_LABEL];
        let new: Vec<&str> = fixed.into_iter().chain(selector_keys).collect();
        self.wanted.send_if_modified(|wanted| {
            if wanted.as_ref().is_some_and(|keys| new.iter().all(|k| keys.contains(*k))) {
                return false;
            }
            let mut grown = wanted.as_deref().cloned().unwrap_or_default();
            grown.extend(new.iter().map(|k| (*k).to_owned()));
            *wanted = Some(Arc::new(grown));
            true
        })
    }

    /// The wanted keys now, if any are.
    pub fn wanted(&self) -> Option<Keys> {
        self.wanted.borrow().clone()
    }

    /// Each set of wanted keys the Kyma watch is to list with, from the first on; with each,
    /// a future that resolves once the wanted keys grew past it (and never when they cannot
    /// any more). Ends when nothing can want keys any more.
    pub fn generations(&self) -> impl Stream<Item = (Keys, BoxFuture<'static, ()>)> + Send + use<> {
        let mut first = self.wanted.subscribe();
        first.mark_changed();
        futures::stream::unfold(first, |mut rx| async move {
            loop {
                rx.changed().await.ok()?;
                let keys = rx.borrow_and_update().clone();
                if let Some(keys) = keys {
                    let mut next = rx.clone();
                    let grown = async move {
                        if next.changed().await.is_err() {
                            std::future::pending::<()>().await;
                        }
                    };
                    return Some(((keys, grown.boxed()), rx));
                }
            }
        })
    }

    /// Records that the Kyma cache now holds every Kyma trimmed to `keys` (a list done).
    pub fn listed(&self, keys: Keys) {
        self.listed.send_replace(Some(keys));
    }

    /// Whether the Kyma cache holds every label of `keys` that a Kyma carries: false until a
    /// list with all of them kept is complete.
    pub fn covers<'a>(&self, mut keys: impl Iterator<Item = &'a str>) -> bool {
        self.listed.borrow().as_ref().is_some_and(|listed| keys.all(|k| listed.contains(k)))
    }
}

#[cfg(test)]
mod tests {
    use std::pin::pin;
    use std::time::Duration;

    use futures::StreamExt;

    use super::*;

    #[test]
    fn wanted_keys_hold_the_flags_and_only_grow() {
        let keys = KymaLabelKeys::new();
        assert!(keys.wanted().is_none());
        assert!(keys.want(["region"]));
        let wanted = keys.wanted().expect("wanted");
        for k in [BETA_LABEL, INTERNAL_LABEL, SKIP_RECONCILIATION_LABEL, "region"] {
            assert!(wanted.contains(k), "{k}");
        }
        // Already wanted, or fewer: nothing to list again.
        assert!(!keys.want(["region"]));
        assert!(!keys.want([]));
        assert!(keys.want(["plan", "region"]));
        assert_eq!(keys.wanted().expect("wanted").len(), 5);
    }

    #[test]
    fn covers_only_what_a_complete_list_kept() {
        let keys = KymaLabelKeys::new();
        assert!(!keys.covers(std::iter::empty()), "nothing is covered before the first list");
        keys.want(["region"]);
        assert!(!keys.covers(["region"].into_iter()), "wanted is not listed");
        keys.listed(keys.wanted().expect("wanted"));
        assert!(keys.covers(["region"].into_iter()));
        assert!(keys.covers(std::iter::empty()));
        keys.want(["plan"]);
        assert!(!keys.covers(["plan", "region"].into_iter()));
        assert!(keys.covers(["region"].into_iter()));
    }

    #[tokio::test]
    async fn a_generation_ends_when_the_keys_grow() {
        let keys = KymaLabelKeys::new();
        let mut generations = pin!(keys.generations());
        assert!(generations.next().now_or_never().is_none(), "no generation before a wanted key");
        keys.want(["region"]);
        let (first, grown) = tokio::time::timeout(Duration::from_secs(5), generations.next())
            .await
            .expect("a first generation")
            .expect("not ended");
        assert!(first.contains("region"));
        let mut grown = pin!(grown);
        assert!(grown.as_mut().now_or_never().is_none());
        keys.want(["region"]);
        assert!(grown.as_mut().now_or_never().is_none(), "the same keys start no new generation");
        keys.want(["plan"]);
        tokio::time::timeout(Duration::from_secs(5), grown).await.expect("grown");
        let (second, _) = generations.next().now_or_never().flatten().expect("a second generation");
        assert!(second.contains("plan") && second.contains("region"));
    }
}
