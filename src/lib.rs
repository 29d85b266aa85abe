//! catalogsync keeps every SKR's copy of Kyma's module catalog (ModuleTemplates and
//! ModuleReleaseMetas) in sync with the KCP.
//!
//! The modules form layers, written once in `docs/architecture.md` ("Layers") and checked
//! by `tests/architecture.rs`: a module uses only its own layer and those below, and no two
//! files use each other. From the bottom: [`api`], [`text`], [`label`], [`kcp`], [`health`];
//! [`catalog`] (pure); the pure parts and the client of [`skr`]; [`error`]; the rest of
//! [`skr`]; [`config`], [`telemetry`], [`metrics`]; [`sharding`]; [`sync`]; [`watches`],
//! [`explain`], [`http`]; [`app`].

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
