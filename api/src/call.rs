//! Each request paired with the type of its answer: [`Client::ask`] with
//! [`Request::port_list`] returns `Vec<PortInfo>`, checked by the compiler
//! rather than by the caller naming a type to decode into.
//!
//! [`Client::ask`]: crate::Client::ask

use std::marker::PhantomData;

use serde::{Deserialize, Serialize};

use crate::protocol::{
    BridgeInfo, MacInfo, PortInfo, PortStats, Request, TraceEntry, VtepInfo, WorkerInfo,
};
use crate::spec::PortSpec;

/// A request, and `A`, the type of the `result` it is answered with.
#[derive(Debug, Clone, PartialEq)]
pub struct Call<A> {
    request: Request,
    answer: PhantomData<fn() -> A>,
}

impl<A> Call<A> {
    fn new(request: Request) -> Call<A> {
        Call {
            request,
            answer: PhantomData,
        }
    }

    /// The request as sent.
    pub fn request(&self) -> &Request {
        &self.request
    }
}

/// The answer to `ping`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pong {
    /// The daemon's version.
    pub version: String,
}

impl Request {
    /// `ping`: the daemon answers.
    pub fn ping() -> Call<Pong> {
        Call::new(Request::Ping)
    }
    /// `port_add`: the port made from `spec`.
    pub fn port_add(spec: PortSpec) -> Call<PortInfo> {
        Call::new(Request::PortAdd {
            port: Box::new(spec),
        })
    }
    /// `port_del`.
    pub fn port_del(name: &str) -> Call<()> {
        Call::new(Request::PortDel {
            name: name.to_string(),
        })
    }
    /// `port_set`: replaces port `name`'s station addresses, policy and
    /// policers (both directions), those given.
    pub fn port_set(
        name: &str,
        ips: Option<Vec<std::net::IpAddr>>,
        policy: Option<crate::policy::PortPolicy>,
        rate_limit: Option<crate::spec::RateLimits>,
    ) -> Call<()> {
        Call::new(Request::PortSet {
            name: name.to_string(),
            ips,
            policy,
            rate_limit,
        })
    }
    /// `port_list`: every port, failed ones included.
    pub fn port_list() -> Call<Vec<PortInfo>> {
        Call::new(Request::PortList)
    }
    /// `stats`: of port `name`, or of every port.
    pub fn stats(name: Option<String>) -> Call<Vec<PortStats>> {
        Call::new(Request::Stats { name })
    }
    /// `bridge_add`.
    pub fn bridge_add(name: &str) -> Call<()> {
        Call::new(Request::BridgeAdd {
            name: name.to_string(),
        })
    }
    /// `bridge_del`.
    pub fn bridge_del(name: &str) -> Call<()> {
        Call::new(Request::BridgeDel {
            name: name.to_string(),
        })
    }
    /// `bridge_list`.
    pub fn bridge_list() -> Call<Vec<BridgeInfo>> {
        Call::new(Request::BridgeList)
    }
    /// `mac_list`: the MAC table of `bridge`.
    pub fn mac_list(bridge: &str) -> Call<Vec<MacInfo>> {
        Call::new(Request::MacList {
            bridge: bridge.to_string(),
        })
    }
    /// `vtep_add`, leaving from `local` (`None`: the overlay's, or the
    /// route's): the remote VTEP as joined.
    pub fn vtep_add(
        overlay: &str,
        remote: std::net::IpAddr,
        local: Option<std::net::IpAddr>,
    ) -> Call<VtepInfo> {
        Call::new(Request::VtepAdd {
            overlay: overlay.to_string(),
            remote,
            local,
        })
    }
    /// `vtep_del`.
    pub fn vtep_del(overlay: &str, remote: std::net::IpAddr) -> Call<()> {
        Call::new(Request::VtepDel {
            overlay: overlay.to_string(),
            remote,
        })
    }
    /// `vtep_list`.
    pub fn vtep_list() -> Call<Vec<VtepInfo>> {
        Call::new(Request::VtepList)
    }
    /// `overlay_slice`: the overlay's bridge as it is then.
    pub fn overlay_slice(overlay: &str, slice: Option<u32>) -> Call<BridgeInfo> {
        Call::new(Request::OverlaySlice {
            overlay: overlay.to_string(),
            slice,
        })
    }
    /// `vtep_stations`.
    pub fn vtep_stations(
        overlay: &str,
        remote: std::net::IpAddr,
        stations: Vec<crate::RemoteStation>,
    ) -> Call<()> {
        Call::new(Request::VtepStations {
            overlay: overlay.to_string(),
            remote,
            stations,
        })
    }
    /// `vtep_station_sets`.
    pub fn vtep_station_sets(overlay: &str, sets: Vec<crate::StationSet>) -> Call<()> {
        Call::new(Request::VtepStationSets {
            overlay: overlay.to_string(),
            sets,
        })
    }
    /// `worker_list`.
    pub fn worker_list() -> Call<Vec<WorkerInfo>> {
        Call::new(Request::WorkerList)
    }
    /// `trace`: up to `count` frames (of `port`, if given), answered once
    /// they are in or `timeout_ms` passed.
    pub fn trace(
        count: Option<u32>,
        port: Option<String>,
        timeout_ms: Option<u64>,
    ) -> Call<Vec<TraceEntry>> {
        Call::new(Request::Trace {
            count,
            port,
            timeout_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A call's answer type decodes the `result` the daemon's handler
    /// builds for it (the shapes of `control/daemon/api.rs`).
    fn decodes<A: serde::de::DeserializeOwned>(_: &Call<A>, result: serde_json::Value) {
        serde_json::from_value::<A>(result).unwrap();
    }

    #[test]
    fn each_call_names_its_op_and_decodes_its_answer() {
        let op = |r: &Request| serde_json::to_value(r).unwrap()["op"].clone();
        let p = Request::ping();
        assert_eq!(op(p.request()), "ping");
        decodes(&p, serde_json::json!({"version": "0.1.0"}));
        let d = Request::port_del("p");
        assert_eq!(op(d.request()), "port_del");
        decodes(&d, serde_json::Value::Null);
        let l = Request::port_list();
        assert_eq!(op(l.request()), "port_list");
        decodes(&l, serde_json::json!([]));
        assert_eq!(op(Request::stats(None).request()), "stats");
        assert_eq!(op(Request::bridge_add("b").request()), "bridge_add");
        assert_eq!(op(Request::bridge_del("b").request()), "bridge_del");
        assert_eq!(op(Request::bridge_list().request()), "bridge_list");
        assert_eq!(op(Request::mac_list("b").request()), "mac_list");
        assert_eq!(op(Request::worker_list().request()), "worker_list");
        assert_eq!(op(Request::trace(None, None, None).request()), "trace");
    }
}
