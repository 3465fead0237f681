//! CNI errors: the spec's well-known codes and ours (100 and up).

use serde::Serialize;

/// Incompatible CNI version.
pub const INCOMPATIBLE_VERSION: u32 = 1;
/// Unsupported field in the network configuration.
pub const UNSUPPORTED_FIELD: u32 = 2;
/// Container unknown or does not exist.
pub const UNKNOWN_CONTAINER: u32 = 3;
/// Invalid necessary environment variables.
pub const INVALID_ENV: u32 = 4;
/// I/O failure.
pub const IO_FAILURE: u32 = 5;
/// Failed to decode content.
pub const DECODE_FAILURE: u32 = 6;
/// Invalid network configuration.
pub const INVALID_CONFIG: u32 = 7;
/// Try again later.
pub const TRY_AGAIN_LATER: u32 = 11;
/// STATUS: the plugin is not available.
pub const PLUGIN_NOT_AVAILABLE: u32 = 50;
/// The switch refused or failed an operation on a port or bridge.
pub const SWITCH_ERROR: u32 = 100;
/// The delegated IPAM plugin failed without a CNI error of its own.
pub const IPAM_FAILURE: u32 = 101;
/// CHECK found the attachment not as configured.
pub const CHECK_FAILED: u32 = 102;

/// A CNI error, printed as the spec's error JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, thiserror::Error)]
#[error("{msg} (code {code})")]
pub struct CniError {
    /// Error code.
    pub code: u32,
    /// Short message.
    pub msg: String,
    /// Longer explanation.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub details: String,
}

impl CniError {
    /// An error with `code` and message.
    pub fn new(code: u32, msg: impl Into<String>) -> CniError {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// Adds details.
    pub fn details(mut self, d: impl Into<String>) -> CniError {
        self.details = d.into();
        self
    }

    /// The error JSON for a result of `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut v = serde_json::to_value(self).unwrap_or_default();
        v["cniVersion"] = cni_version.into();
        v
    }
}

/// An I/O failure on `what`.
pub fn io(what: impl std::fmt::Display, e: std::io::Error) -> CniError {
    CniError::new(IO_FAILURE, format!("{what}: {e}"))
}
