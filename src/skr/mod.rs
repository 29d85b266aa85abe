//! Reaching SKRs: access Secrets in the KCP, the kubeconfig allowlist, where SKRs may be,
//! bounded requests, and the access to one SKR.

pub mod access;
pub mod connector;
pub mod destination;
pub mod kubeconfig;
pub mod request;

pub use access::{AccessSecrets, AccessSettings, SecretRef, find_access_secret};
pub use connector::{Recalled, SkrConnector, SkrEntry, SkrState};
