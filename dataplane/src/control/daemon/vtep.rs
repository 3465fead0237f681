//! Overlays' remote VTEPs: `vtep add`, `vtep del`, `vtep list`, and the
//! config's at start. A remote VTEP of an overlay is its tunnel ports (one
//! per VNI, named after the overlay and the address), which the daemon
//! makes from the overlay's config and persists as it does any port.

use std::collections::BTreeMap;
use std::net::IpAddr;

use switchyard_api::{ApiError, ErrorCode, VtepInfo};

use super::ports::Begin;
use super::Daemon;
use crate::config::Overlay;
use crate::port::kernel::netdev::route_source;
use crate::port::Start;

impl Daemon {
    fn overlay(&self, name: &str) -> Result<Overlay, ApiError> {
        self.cfg.overlays.get(name).cloned().ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!("overlay: no overlay named {name:?} in the config"),
            )
        })
    }

    /// Joins overlay `name` to `remote`: makes the tunnels it lacks (a
    /// tunnel of that name that exists stays as it is). Its local address
    /// is the overlay's, or the one the host's route to `remote` leaves
    /// from. `from_config`: a remote of the config, joined at start.
    pub(super) fn vtep_add(
        &mut self,
        name: &str,
        remote: IpAddr,
        from_config: bool,
    ) -> Result<VtepInfo, ApiError> {
        let o = self.overlay(name)?;
        let local = match o.local {
            Some(l) => l,
            None => route_source(remote).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!("remote: no route to {remote} to leave from: {e}"),
                )
            })?,
        };
        let mut made: Vec<String> = Vec::new();
        for spec in o.tunnels(name, remote, local) {
            if self.port_names.contains_key(&spec.name) {
                continue;
            }
            let port = spec.name.clone();
            let begin = if from_config {
                Begin::Start(Start::Waiting)
            } else {
                Begin::Start(Start::Now)
            };
            if let Err(e) = self.create_port(spec, from_config, begin) {
                for p in made {
                    let _ = self.delete_port(&p);
                }
                return Err(e);
            }
            made.push(port);
        }
        Ok(self
            .vteps()
            .remove(&(name.to_string(), remote))
            .expect("its tunnels were just made"))
    }

    /// Takes `remote` out of overlay `name`: its tunnels go.
    pub(super) fn vtep_del(&mut self, name: &str, remote: IpAddr) -> Result<(), ApiError> {
        let Some(v) = self.vteps().remove(&(name.to_string(), remote)) else {
            self.overlay(name)?;
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!("remote: overlay {name:?} has no VTEP {remote}"),
            ));
        };
        if v.from_config {
            return Err(ApiError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "remote: {remote} is one of overlay {name:?}'s remotes in the config: take it out there"
                ),
            ));
        }
        for t in v.tunnels {
            self.delete_port(&t)?;
        }
        Ok(())
    }

    /// Every overlay's remote VTEPs, by overlay and address.
    pub(super) fn vtep_list(&self) -> Vec<VtepInfo> {
        self.vteps().into_values().collect()
    }

    /// The remote VTEPs of the overlays: the tunnel ports in an overlay's
    /// bridge, grouped by their remote address.
    fn vteps(&self) -> BTreeMap<(String, IpAddr), VtepInfo> {
        let mut out: BTreeMap<(String, IpAddr), VtepInfo> = BTreeMap::new();
        for e in self.sorted_ports() {
            let Some(bridge) = e.spec.bridge.as_ref() else {
                continue;
            };
            let opts = e.spec.kind.options();
            let (Some(remote), Some(local)) = (opts.remote(), opts.local()) else {
                continue;
            };
            if !self.cfg.overlays.contains_key(bridge) {
                continue;
            }
            let up = e.port.status().link_up;
            let v = out
                .entry((bridge.clone(), remote))
                .or_insert_with(|| VtepInfo {
                    overlay: bridge.clone(),
                    remote,
                    local,
                    tunnels: Vec::new(),
                    link_up: true,
                    from_config: false,
                });
            v.tunnels.push(e.spec.name.clone());
            v.link_up &= up;
            v.from_config |= e.from_config;
        }
        out
    }
}
