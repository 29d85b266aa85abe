//! The sync engine: the Kyma controller ([`reconciler`]), the catalog watcher that requeues
//! affected Kymas ([`catalog`]) behind the shrink guard ([`guard`]), and the per-SKR executor
//! ([`executor`]).

pub mod catalog;
pub mod condition;
pub mod executor;
pub mod guard;
pub mod reconciler;
