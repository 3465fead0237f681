//! `switchyard-webhook`: a mutating admission webhook. A pod whose
//! `k8s.v1.cni.cncf.io/networks` annotation names networks whose
//! NetworkAttachmentDefinitions carry `k8s.v1.cni.cncf.io/resourceName`
//! gets those resources (one per attachment) added to its first
//! container's requests and limits, so the scheduler places it where
//! Switchyard sockets are free and the kubelet calls the device plugin.
//!
//! - [`selection`]: the networks annotation, both forms;
//! - [`mutate`]: the JSON Patch of the pod's resources;
//! - [`review`]: one AdmissionReview, with the NADs read from the API server;
//! - [`serve`]: the HTTPS endpoint.
//!
//! `review` and `serve` come with the `server` feature (on by default); the
//! parser and the patch builder do without it.

#![warn(missing_docs)]

pub mod mutate;
#[cfg(feature = "server")]
pub mod review;
pub mod selection;
#[cfg(feature = "server")]
pub mod serve;
