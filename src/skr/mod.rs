//! Reaching SKRs: access Secrets in the KCP, the kubeconfig allowlist, where SKRs may be,
//! bounded requests, and the per-SKR client cache.

pub mod access;
pub mod destination;
pub mod kubeconfig;
pub mod pool;
pub mod request;

pub use access::{AccessSecrets, AccessSettings, find_access_secret};
pub use pool::{SkrEntry, SkrPool, SkrState};
