//! Sharding: which Kymas this replica may sync.
//!
//! - [`ring`]: pure Kyma → shard mapping and capped consistent-hash assignment of shards to
//!   replicas;
//! - [`handover`]: the pure transition rules of one shard;
//! - [`view`]: the ownership gate the sync path checks;
//! - [`liveness`]: the coordinator's pure judgement of which members are alive;
//! - [`placement`]: the coordinator's pure decision of which shard Leases to create and change;
//! - [`lease`], [`membership`], [`agent`], [`coordinator`]: the Lease I/O;
//! - [`shard_gauges`], [`coordinator_gauges`]: the scrape-time gauges of the agent's and the
//!   coordinator's state, registered on the registry they are handed.
//!
//! See `docs/architecture.md` for the protocol and why it never lets two replicas write to
//! one SKR.

pub mod agent;
pub mod coordinator;
pub mod coordinator_gauges;
pub mod handover;
pub mod lease;
pub mod liveness;
pub mod membership;
pub mod placement;
pub mod ring;
pub mod shard_gauges;
pub mod table;
pub mod view;

use std::time::Duration;

pub use view::{ShardView, SyncGuard};

/// Lease timings.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// How long a member Lease is valid after its renewal.
    pub lease_duration: Duration,
    /// How long after its last successful renewal a replica keeps writing to SKRs.
    pub renew_deadline: Duration,
    /// How often Leases are renewed and re-evaluated.
    pub retry_period: Duration,
    /// Longest wait for in-flight syncs of a shard before it is released.
    pub drain_timeout: Duration,
    /// Bound of one SKR request: how long a write may still be in flight after the last
    /// ownership check that allowed it.
    pub request_timeout: Duration,
    /// Bound of one KCP request (Lease reads and writes).
    pub kcp_request_timeout: Duration,
}

impl Timing {
    /// The lease duration in whole seconds, as Leases store it.
    pub fn lease_secs(&self) -> i32 {
        i32::try_from(self.lease_duration.as_nanos().div_ceil(1_000_000_000).max(1)).unwrap_or(i32::MAX)
    }
}
