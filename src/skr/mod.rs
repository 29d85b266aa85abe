//! Reaching SKRs: access Secrets in the KCP, and the per-SKR client cache.

pub mod access;
pub mod pool;

pub use access::{AccessSecrets, AccessTimeouts, find_access_secret};
pub use pool::{SkrEntry, SkrPool, SkrState};
