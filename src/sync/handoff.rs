//! What the sync layer does when the shard agent hands a shard over
//! ([`ShardWork`]): a shard taken gets what its last
//! holder kept of its SKRs ([`ShardMemory::recall`]); a shard leaving keeps what this replica
//! knows of them for the next holder ([`ShardMemory::keep`]); a shard given up lets go of its
//! Kymas' SKR access and findings ([`KymaRecords::release`]).

use std::sync::Arc;

use futures::future::BoxFuture;
use kube::runtime::reflector::ObjectRef;

use crate::api::Kyma;
use crate::sharding::agent::ShardWork;
use crate::sync::kymas::KymaRecords;
use crate::sync::recall::ShardMemory;

/// The sync layer's side of a shard handover.
pub struct Handoff {
    /// What the replica knows of each Kyma.
    pub kymas: Arc<KymaRecords>,
    /// Where the shard records are kept; `None` (shadow mode): nothing is kept or read.
    pub memory: Option<ShardMemory>,
}

impl ShardWork for Handoff {
    fn taken<'a>(&'a self, shard: u32, kymas: &'a [ObjectRef<Kyma>]) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(memory) = &self.memory {
                memory.recall(shard, kymas).await;
            }
        })
    }

    fn leaving<'a>(&'a self, shard: u32, kymas: &'a [ObjectRef<Kyma>], complete: bool) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            if let Some(memory) = &self.memory {
                memory.keep(shard, kymas, complete).await;
            }
        })
    }

    fn released(&self, kymas: &[ObjectRef<Kyma>]) {
        for kyma in kymas {
            self.kymas.release(&kyma.name);
        }
    }
}
