//! The sync engine: the Kyma controller ([`reconciler`]) and the per-SKR executor
//! ([`executor`]); the catalog publisher that requeues affected Kymas ([`publisher`]) behind the
//! shrink guard ([`guard`]); the published catalog every sync reads ([`state`]); what the replica
//! knows of each Kyma it syncs ([`kymas`]) and the gauges computed from it ([`kyma_gauges`]), which of a Kyma's labels it caches
//! ([`label_keys`]), and what it keeps of its SKRs across restarts ([`recall`]), handed over with a shard
//! ([`handoff`]); the
//! `ModuleCatalog` condition ([`condition`]); the SKR's answers as the executor reads and
//! checks them ([`wire`]).

pub mod condition;
pub mod executor;
pub mod guard;
pub mod handoff;
pub mod kyma_gauges;
pub mod kymas;
pub mod label_keys;
pub mod publisher;
pub mod recall;
pub mod reconciler;
pub mod state;
pub mod wire;
