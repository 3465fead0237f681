//! Overlays' remote VTEPs: `vtep add`, `vtep del`, `vtep list`, and the
//! config's at start. A remote VTEP of an overlay is its tunnel ports (one
//! per VNI, named after the overlay and the address), which the daemon
//! makes from the overlay's config and persists as it does any port.

use std::collections::BTreeMap;
use std::net::IpAddr;

use std::sync::Arc;
use switchyard_api::overlay::{NodeIpam, SavedSlice};

use switchyard_api::{
    ApiError, BridgeCounts, BridgeInfo, ErrorCode, MacAddr, RemoteStation, VtepInfo,
};
use tracing::{error, info, warn};

use super::ports::Begin;
use super::Daemon;
use crate::config::Overlay;
use crate::control::takeover::SavedStations;
use crate::port::kernel::netdev::route_source;
use crate::port::Start;
use crate::switch::neigh::Neighbours;

impl Daemon {
    /// Bridge `name` as listed.
    pub(super) fn bridge_info(&self, name: &str) -> Option<BridgeInfo> {
        let b = self.bridges.get(name)?;
        let overlay = self.cfg.overlays.get(name);
        Some(BridgeInfo {
            name: name.to_string(),
            ports: self
                .sorted_ports()
                .filter(|e| e.spec.bridge.as_deref() == Some(name))
                .map(|e| e.spec.name.clone())
                .collect(),
            macs: self.dp.mac_table(b.id).map(|m| m.len()).unwrap_or(0),
            from_config: b.from_config,
            physnet: self
                .cfg
                .physnets
                .get(name)
                .map(|p| p.interface().to_string()),
            overlay: overlay.map(|o| o.describe()),
            overlay_vlans: overlay
                .map(|o| o.vlans.iter().map(|v| v.vlan).collect())
                .unwrap_or_default(),
            ipam: overlay.and_then(|o| o.ipam.clone()).map(|config| {
                let slice = self.overlay_slices.get(name).copied();
                NodeIpam {
                    ranges: slice
                        .and_then(|s| config.ranges(s).ok())
                        .unwrap_or_default(),
                    slice,
                    config,
                }
            }),
            counters: self
                .dp
                .bridge_stats(b.id)
                .map(|s| {
                    let t = s.totals();
                    BridgeCounts {
                        learned: t.learned,
                        moved: t.moved,
                        evicted: t.evicted,
                        aged: t.aged,
                        flooded: t.flooded,
                        answered: t.answered,
                    }
                })
                .unwrap_or_default(),
        })
    }

    /// Gives this node slice `slice` of overlay `name`'s addresses (none:
    /// `None`).
    pub(super) fn set_overlay_slice(
        &mut self,
        name: &str,
        slice: Option<u32>,
    ) -> Result<(), ApiError> {
        let o = self.overlay(name)?;
        let Some(ipam) = o.ipam else {
            return Err(ApiError::new(
                ErrorCode::InvalidArgument,
                format!("overlay: {name:?} splits no addresses (its config has no ipam)"),
            ));
        };
        match slice {
            Some(s) => {
                ipam.ranges(s).map_err(|e| {
                    ApiError::new(ErrorCode::InvalidArgument, format!("slice: {e}"))
                })?;
                if self.overlay_slices.insert(name.to_string(), s) != Some(s) {
                    info!(overlay = %name, slice = s, "the node's slice of the overlay's addresses");
                }
            }
            None => {
                self.overlay_slices.remove(name);
            }
        }
        Ok(())
    }

    /// The overlays' slices, each with the split it is a slice of, as
    /// they are persisted and handed over.
    pub(super) fn saved_slices(&self) -> BTreeMap<String, SavedSlice> {
        self.overlay_slices
            .iter()
            .filter_map(|(name, &slice)| {
                let split = self.cfg.overlays.get(name)?.ipam.clone()?;
                Some((name.clone(), SavedSlice { slice, split }))
            })
            .collect()
    }

    /// Takes up the overlays' slices persisted: those of overlays the
    /// config still splits the same way (a slice of another split is
    /// other addresses, maybe another node's).
    pub(super) fn restore_slices(&mut self, slices: BTreeMap<String, SavedSlice>) {
        for (name, saved) in slices {
            let now = self.cfg.overlays.get(&name).and_then(|o| o.ipam.as_ref());
            if now == Some(&saved.split) && saved.split.ranges(saved.slice).is_ok() {
                self.overlay_slices.insert(name, saved.slice);
            } else {
                warn!(overlay = %name, slice = saved.slice, "a persisted slice of a split the config no longer has: dropped");
            }
        }
    }

    fn overlay(&self, name: &str) -> Result<Overlay, ApiError> {
        self.cfg.overlays.get(name).cloned().ok_or_else(|| {
            ApiError::new(
                ErrorCode::NotFound,
                format!("overlay: no overlay named {name:?} in the config"),
            )
        })
    }

    /// Joins overlay `name` to `remote`: makes the tunnels it lacks. Its
    /// local address is `local`, else the overlay's, else the one the
    /// host's route to `remote` leaves from. A tunnel of that name that
    /// exists stays as it is, unless `local` is given and it leaves from
    /// another address: then the VTEP's tunnels are made again from
    /// `local` (as OVS changes a tunnel's `local_ip` in place). `from_config`:
    /// a remote of the config, joined at start.
    pub(super) fn vtep_add(
        &mut self,
        name: &str,
        remote: IpAddr,
        local: Option<IpAddr>,
        from_config: bool,
    ) -> Result<VtepInfo, ApiError> {
        let o = self.overlay(name)?;
        if let Some(asked) = local {
            if let Some(v) = self.vteps().remove(&(name.to_string(), remote)) {
                if v.local != asked {
                    return self.vtep_move(name, &o, v, asked);
                }
            }
        }
        let from = match local.or(o.local) {
            Some(l) => l,
            None => route_source(remote).map_err(|e| {
                ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!("remote: no route to {remote} to leave from: {e}"),
                )
            })?,
        };
        self.make_tunnels(name, &o, remote, from, from_config)?;
        Ok(self
            .vteps()
            .remove(&(name.to_string(), remote))
            .expect("its tunnels were just made"))
    }

    /// Makes the tunnels of overlay `name` (config `o`) to `remote` from
    /// `local` that do not exist; none if one cannot be made.
    fn make_tunnels(
        &mut self,
        name: &str,
        o: &Overlay,
        remote: IpAddr,
        local: IpAddr,
        from_config: bool,
    ) -> Result<(), ApiError> {
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
        // New tunnels hold no pins yet.
        self.pinned.remove(&(name.to_string(), remote));
        self.pin_stations(name, o, remote, &[]);
        self.refresh_neighbours(name);
        Ok(())
    }

    /// Gives each remote VTEP of `sets` of overlay `name` its stations, in
    /// place of those it had: their MACs pinned to its tunnel of their VLAN
    /// (the old ones' unpinned), then the bridge's neighbours made again
    /// (once) from the stations pinned. A station in no VLAN of the
    /// overlay, with a group MAC or an address that is no station's, is
    /// refused (naming it, `at` of its set's index prefixing the field) and
    /// nothing changes.
    pub(super) fn set_stations(
        &mut self,
        name: &str,
        sets: Vec<(IpAddr, Vec<RemoteStation>)>,
        at: impl Fn(usize) -> String,
    ) -> Result<(), ApiError> {
        let o = self.overlay(name)?;
        for (k, (remote, stations)) in sets.iter().enumerate() {
            if let Some(j) = sets[..k].iter().position(|(r, _)| r == remote) {
                return Err(ApiError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "{}remote: {remote} is also {}",
                        at(k),
                        at(j).trim_end_matches('.')
                    ),
                ));
            }
            check_stations(name, &o, stations, &at(k))?;
        }
        for (remote, stations) in sets {
            self.put_stations(name, &o, remote, stations);
        }
        self.refresh_neighbours(name);
        Ok(())
    }

    /// Gives remote VTEP `remote` of overlay `name` (config `o`) its
    /// stations (checked), pinning and unpinning; the neighbours are the
    /// caller's to make again.
    fn put_stations(
        &mut self,
        name: &str,
        o: &Overlay,
        remote: IpAddr,
        stations: Vec<RemoteStation>,
    ) {
        let key = (name.to_string(), remote);
        let old = if stations.is_empty() {
            self.stations.remove(&key)
        } else {
            self.stations.insert(key, stations)
        };
        let freed = self.pin_stations(name, o, remote, old.as_deref().unwrap_or_default());
        // A MAC another VTEP's station has too (a pod that moved, its new
        // node's update first): pinned there now that it is free.
        if !freed.is_empty() {
            let others: Vec<IpAddr> = self
                .stations
                .iter()
                .filter(|((ov, r), list)| {
                    ov == name
                        && *r != remote
                        && list.iter().any(|s| freed.contains(&(s.mac, s.vlan)))
                })
                .map(|((_, r), _)| *r)
                .collect();
            for r in others {
                self.pin_stations(name, o, r, &[]);
            }
        }
    }

    /// Pins the stations behind `remote` of overlay `name` (config `o`) to
    /// its tunnels (those not pinned yet), unpinning `old` (the ones it
    /// had) where they are no longer listed: the (MAC, VLAN)s unpinned. A
    /// MAC the bridge has on a local port (a pod's, learned or pinned) or
    /// pinned to another VTEP is left where it is: that station is not
    /// answered for (logged, once per call).
    fn pin_stations(
        &mut self,
        name: &str,
        o: &Overlay,
        remote: IpAddr,
        old: &[RemoteStation],
    ) -> Vec<(MacAddr, Option<u16>)> {
        let key = (name.to_string(), remote);
        let now = self.stations.get(&key).cloned().unwrap_or_default();
        let tunnel = |d: &Daemon, vlan: Option<u16>| {
            let port = Overlay::tunnel_name(name, remote, vlan.filter(|_| o.vni.is_none()));
            d.port_names.get(&port).copied()
        };
        let mut freed = Vec::new();
        for s in old
            .iter()
            .filter(|s| !now.iter().any(|n| n.mac == s.mac && n.vlan == s.vlan))
        {
            let was = self
                .pinned
                .get_mut(&key)
                .is_some_and(|p| p.remove(&(s.mac, s.vlan)));
            if let (true, Some(id)) = (was, tunnel(self, s.vlan)) {
                self.dp.unpin_macs(id, &[s.mac]);
                freed.push((s.mac, s.vlan));
            }
        }
        let (mut refused, mut first) = (0usize, None);
        for s in &now {
            if self
                .pinned
                .get(&key)
                .is_some_and(|p| p.contains(&(s.mac, s.vlan)))
            {
                continue;
            }
            let Some(id) = tunnel(self, s.vlan) else {
                continue;
            };
            match self.dp.pin_remote(id, s.mac) {
                Ok(()) => {
                    self.pinned
                        .entry(key.clone())
                        .or_default()
                        .insert((s.mac, s.vlan));
                }
                Err(other) => {
                    refused += 1;
                    first.get_or_insert((s.mac, other.and_then(|p| self.dp.port_name(p))));
                }
            }
        }
        if let Some((mac, held_by)) = first {
            warn!(overlay = %name, %remote, refused, %mac, ?held_by, "stations whose MAC the bridge has elsewhere (a local port's, another VTEP's) or cannot place: not pinned, not answered for");
        }
        freed
    }

    /// Makes overlay `name`'s bridge's neighbours again from its VTEPs'
    /// stations that are pinned to their tunnels (a station without, its
    /// MAC held elsewhere or its tunnel not made, is not answered for).
    fn refresh_neighbours(&mut self, name: &str) {
        let Some(b) = self.bridges.get(name) else {
            return;
        };
        let pinned = &self.pinned;
        let entries = self
            .stations
            .range((name.to_string(), IpAddr::from([0u8; 4]))..)
            .take_while(|((o, _), _)| o == name)
            .flat_map(|(k, list)| {
                let p = pinned.get(k);
                list.iter()
                    .filter(move |s| p.is_some_and(|p| p.contains(&(s.mac, s.vlan))))
            })
            .flat_map(|s| {
                s.ips
                    .iter()
                    .map(move |ip| ((s.vlan.unwrap_or(0), *ip), s.mac))
            });
        let n = Neighbours::new(entries);
        self.dp.set_neighbours(b.id, Some(Arc::new(n)));
    }

    /// Gives a local port about to pin `macs` on bridge `bridge` (in its
    /// access VLAN `vlan`, or the VLANs of its `trunk`) the ones a remote VTEP's
    /// station has pinned: the pod on this node is where the MAC is, and
    /// the cluster's word (a pod that moved here, its old node's entry not
    /// yet taken out) is not answered for any longer.
    pub(super) fn yield_station_macs(
        &mut self,
        bridge: &str,
        vlan: Option<u16>,
        trunk: Option<&switchyard_api::VlanSet>,
        macs: &[MacAddr],
    ) {
        if macs.is_empty() {
            return;
        }
        let Some(o) = self.cfg.overlays.get(bridge).cloned() else {
            return;
        };
        let mut yielded = false;
        for ((overlay, remote), set) in self.pinned.iter_mut() {
            if overlay != bridge {
                continue;
            }
            let gone: Vec<super::StationKey> = set
                .iter()
                .filter(|(m, v)| {
                    let carried = match trunk {
                        Some(t) => t.contains(v.unwrap_or(0)),
                        None => *v == vlan,
                    };
                    macs.contains(m) && carried
                })
                .copied()
                .collect();
            for (m, v) in gone {
                set.remove(&(m, v));
                let port = Overlay::tunnel_name(bridge, *remote, v.filter(|_| o.vni.is_none()));
                if let Some(id) = self.port_names.get(&port) {
                    self.dp.unpin_macs(*id, &[m]);
                }
                info!(overlay = %bridge, %remote, mac = %m, "a local port takes a remote station's MAC: the station is no longer answered for");
                yielded = true;
            }
        }
        if yielded {
            self.refresh_neighbours(bridge);
        }
    }

    /// Pins again, after a local port of bridge `bridge` went, the
    /// stations of its VTEPs that are not pinned (one whose MAC the port
    /// had).
    pub(super) fn repin_stations(&mut self, bridge: &str) {
        let Some(o) = self.cfg.overlays.get(bridge).cloned() else {
            return;
        };
        let remotes: Vec<IpAddr> = self
            .stations
            .keys()
            .filter(|(ov, _)| ov == bridge)
            .map(|(_, r)| *r)
            .collect();
        if remotes.is_empty() {
            return;
        }
        for r in remotes {
            self.pin_stations(bridge, &o, r, &[]);
        }
        self.refresh_neighbours(bridge);
    }

    /// Takes up the stations a takeover handed over, once their tunnels
    /// are made (their pins came with the MAC table).
    pub(super) fn restore_stations(&mut self, saved: Vec<SavedStations>) {
        let mut overlays = std::collections::BTreeSet::new();
        for s in saved {
            let Ok(o) = self.overlay(&s.overlay) else {
                continue;
            };
            self.stations
                .insert((s.overlay.clone(), s.remote), s.stations);
            self.pin_stations(&s.overlay, &o, s.remote, &[]);
            overlays.insert(s.overlay);
        }
        for o in overlays {
            self.refresh_neighbours(&o);
        }
    }

    /// The stations, as a takeover hands them over.
    pub(super) fn saved_stations(&self) -> Vec<SavedStations> {
        self.stations
            .iter()
            .map(|((overlay, remote), stations)| SavedStations {
                overlay: overlay.clone(),
                remote: *remote,
                stations: stations.clone(),
            })
            .collect()
    }

    /// Makes the tunnels of VTEP `v` of overlay `name` (config `o`) again
    /// from `local`: refused for a remote of the config (the config makes
    /// it from its own address) and for tunnels that could not be made
    /// (checked before the old ones go; if making them fails all the same,
    /// the old ones are made again).
    fn vtep_move(
        &mut self,
        name: &str,
        o: &Overlay,
        v: VtepInfo,
        local: IpAddr,
    ) -> Result<VtepInfo, ApiError> {
        if v.from_config {
            return Err(ApiError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "local: {} is one of overlay {name:?}'s remotes in the config, joined from {}: change it there",
                    v.remote, v.local
                ),
            ));
        }
        let invalid = |m: String| ApiError::new(ErrorCode::InvalidArgument, m);
        for spec in o.tunnels(name, v.remote, local) {
            spec.validate("").map_err(|e| invalid(e.to_string()))?;
        }
        // An address the host has (the underlay binds to it).
        std::net::UdpSocket::bind((local, 0))
            .map_err(|e| invalid(format!("local: {local} is no address of this host ({e})")))?;
        info!(overlay = %name, remote = %v.remote, from = %v.local, to = %local, "the VTEP's tunnels leave from another address: made again");
        for t in &v.tunnels {
            self.delete_port(t)?;
        }
        if let Err(e) = self.make_tunnels(name, o, v.remote, local, false) {
            if let Err(again) = self.make_tunnels(name, o, v.remote, v.local, false) {
                error!(overlay = %name, remote = %v.remote, "cannot make the VTEP's tunnels again from {}: {}", v.local, again.message);
            }
            return Err(e);
        }
        Ok(self
            .vteps()
            .remove(&(name.to_string(), v.remote))
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
        // Its stations go with it (their pins went with the tunnels).
        let key = (name.to_string(), remote);
        self.stations.remove(&key);
        self.pinned.remove(&key);
        self.refresh_neighbours(name);
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
                    stations: self
                        .stations
                        .get(&(bridge.clone(), remote))
                        .map_or(0, Vec::len),
                });
            v.tunnels.push(e.spec.name.clone());
            v.link_up &= up;
            v.from_config |= e.from_config;
        }
        out
    }
}

/// Checks the stations of one VTEP of overlay `name` (config `o`): a
/// unicast MAC, a VLAN the overlay carries, station addresses; an error
/// names the field, `at` prefixing it.
fn check_stations(
    name: &str,
    o: &Overlay,
    stations: &[RemoteStation],
    at: &str,
) -> Result<(), ApiError> {
    let invalid = |m: String| ApiError::new(ErrorCode::InvalidArgument, m);
    for (i, s) in stations.iter().enumerate() {
        if !RemoteStation::is_station_mac(&s.mac) {
            return Err(invalid(format!(
                "{at}stations[{i}].mac: {} is not a station's address",
                s.mac
            )));
        }
        let known = match (o.vni, s.vlan) {
            (Some(_), None) => true,
            (None, Some(v)) => o.vlans.iter().any(|x| x.vlan == v),
            _ => false,
        };
        if !known {
            return Err(invalid(format!(
                "{at}stations[{i}].vlan: {} is not a VLAN of overlay {name:?} ({})",
                s.vlan.map_or("none".to_string(), |v| v.to_string()),
                o.describe()
            )));
        }
        if let Some((j, a)) = s
            .ips
            .iter()
            .enumerate()
            .find(|(_, a)| !RemoteStation::is_station_address(a))
        {
            return Err(invalid(format!(
                "{at}stations[{i}].ips[{j}]: {a} is no station's address"
            )));
        }
    }
    Ok(())
}
