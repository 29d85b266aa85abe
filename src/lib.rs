//! catalogsync keeps every SKR's copy of Kyma's module catalog (ModuleTemplates and
//! ModuleReleaseMetas) in sync with the KCP.
pub mod api;
pub mod catalog;
