//! catalogsync keeps every SKR's copy of Kyma's module catalog (ModuleTemplates and
//! ModuleReleaseMetas) in sync with the KCP.
//!
//! Layers, dependencies pointing down only:
//!
//! - [`api`]: CRD types and names;
//! - [`catalog`]: pure snapshot, desired set, render and plan;
//! - [`skr`]: access Secrets and SKR clients;
//! - [`sync`]: the controller, the catalog watcher and the executor;
//! - [`sharding`]: the ownership gate;
//! - [`app`], [`http`], [`health`], [`metrics`], [`telemetry`], [`config`]: the process
//!   around them; [`explain`]: `catalogsync explain`, one Kyma's catalog and why;
//! - [`text`]: untrusted text made safe to print; [`kcp`]: bounded KCP requests; [`label`]:
//!   bounded classifications (condition reasons, metric label values) as enums.

pub mod api;
pub mod app;
pub mod catalog;
pub mod config;
pub mod error;
pub mod explain;
#[cfg(any(test, feature = "fixtures"))]
pub mod fixtures;
pub mod health;
pub mod http;
pub mod kcp;
pub mod label;
pub mod metrics;
pub mod sharding;
pub mod skr;
pub mod sync;
pub mod telemetry;
pub mod text;
pub mod watches;
