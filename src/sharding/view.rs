//! [`ShardView`]: the ownership gate every reconcile and every SKR write consults.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Answers "is this Kyma mine to sync?" and "may I write to its SKR right now?".
///
/// A single replica owns every Kyma. The sharded mode replaces the inside of this type, not
/// its callers.
#[derive(Clone, Debug)]
pub struct ShardView {
    fenced: Arc<AtomicBool>,
}

impl Default for ShardView {
    fn default() -> Self {
        Self::single_replica()
    }
}

impl ShardView {
    /// A view that owns everything until fenced.
    pub fn single_replica() -> Self {
        Self { fenced: Arc::new(AtomicBool::new(false)) }
    }

    /// Whether the Kyma `namespace/name` belongs to this replica.
    pub fn owns(&self, _namespace: &str, _name: &str) -> bool {
        !self.fenced.load(Ordering::Acquire)
    }

    /// Whether a write to the SKR of `namespace/name` is allowed right now; checked right
    /// before every SKR write.
    pub fn may_write(&self, namespace: &str, name: &str) -> bool {
        self.owns(namespace, name)
    }

    /// Stops all SKR writes at once (shutdown).
    pub fn fence(&self) {
        self.fenced.store(true, Ordering::Release);
    }
}
