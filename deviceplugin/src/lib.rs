//! `switchyard-device-plugin`: advertises Switchyard socket ports to the
//! kubelet as extended resources (Device Plugin API v1beta1) and describes
//! them to container runtimes as CDI devices.
//!
//! - [`config`]: pools, directories and naming;
//! - [`plugin`]: the `DevicePlugin` gRPC service of one pool;
//! - [`cdi`]: the CDI spec file;
//! - [`run`]: serving, registration, kubelet restarts, health, cleanup;
//! - [`api`]: the generated gRPC types (from `proto/`).
//!
//! On Allocate the plugin creates each device's socket directory, writes
//! its device-info file for Multus (which hands it to `switchyard-cni`
//! through `CNIDeviceInfoFile`), and returns the directory as a mount at the
//! same path, environment variables naming the socket(s), and CDI device
//! names. The CNI then asks the switch to create the port on that socket.

#![warn(missing_docs)]

pub mod cdi;
pub mod config;
pub mod plugin;
pub mod run;

/// The kubelet Device Plugin API (generated from `proto/`).
#[allow(missing_docs, clippy::all)]
pub mod api {
    tonic::include_proto!("v1beta1");
}

/// The API version sent in `RegisterRequest`.
pub const API_VERSION: &str = "v1beta1";
