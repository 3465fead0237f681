//! The overlays' stations: each remote node's pods on the overlay
//! networks, as the switch is given them behind the node's VTEP
//! (`Request::VtepStations`). The switch pins their MACs to the VTEP's
//! tunnel and answers ARP requests and neighbour solicitations for their
//! addresses itself, so that a pod that looks for another floods nothing to
//! the other nodes, as flannel programs its neighbours from the Nodes and
//! OVN answers from its logical ports.
//!
//! What is known of a pod comes from the API:
//! - its node (`spec.nodeName`), and so the VTEP it sits behind;
//! - its MAC and addresses on each network: Multus's `network-status`,
//!   which is what the CNI result said;
//! - which networks are on which overlay, and on which of its VLANs: the
//!   NetworkAttachmentDefinitions ([`network_view`]).
//!
//! A network's pods are known only where the switch holds them to their
//! result: a netconf that pins the result's MAC (`pin` absent or
//! `result`, as the shipped overlay NAD). A pod on a network that pins the
//! first MAC it sends from, or none, may send from another MAC than its
//! result's: its frames are learned on the data path as before, and its
//! addresses looked for by flooding.
//!
//! Pure: the node agent builds the inputs from its watches.

use std::collections::BTreeMap;
use std::net::IpAddr;

use switchyard_api::RemoteStation;

use crate::policy::PodView;

/// What an overlay network's NAD says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    /// The overlay (its bridge): the netconf's `physnet`, else its
    /// `bridge`.
    pub overlay: String,
    /// The netconf's access VLAN, if it has one.
    pub vlan: Option<u16>,
    /// Whether its ports carry VLANs tagged (`trunk`): the VLAN a pod's
    /// frame is in is the pod's choice, so none is known.
    pub trunk: bool,
    /// Whether its ports pass frames only from the MAC the result reports
    /// (`pin` absent or `result`): then the network-status MAC is the
    /// pod's.
    pub result_mac: bool,
}

/// The network a NAD's `spec.config` describes, if it is Switchyard's: the
/// netconf itself or a conflist with a plugin of type `switchyard`
/// (`None` for another plugin's, a config that does not read, or none,
/// as a NAD that names a file on the node has).
pub fn network_view(config: &str) -> Option<Network> {
    let v: serde_json::Value = serde_json::from_str(config).ok()?;
    let conf = match v.get("plugins") {
        Some(list) => list
            .as_array()?
            .iter()
            .find(|p| p["type"] == "switchyard")?,
        None => &v,
    };
    if conf["type"] != "switchyard" {
        return None;
    }
    let text = |k: &str| conf.get(k).and_then(|x| x.as_str());
    // The plugin's default bridge is `default` (an overlay may be named
    // so).
    let overlay = text("physnet")
        .or_else(|| text("bridge"))
        .unwrap_or("default")
        .to_string();
    let vlan = match conf.get("vlan").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => Some(u16::try_from(v.as_u64()?).ok()?),
    };
    Some(Network {
        overlay,
        vlan,
        trunk: conf.get("trunk").is_some_and(|t| !t.is_null()),
        result_mac: matches!(text("pin"), None | Some("result")),
    })
}

/// A NetworkAttachmentDefinition as [`network_view`] reads it, keyed as
/// network-status names networks (`namespace/name`).
pub fn nad_view(obj: &kube::core::DynamicObject) -> Option<(String, Option<Network>)> {
    let key = format!(
        "{}/{}",
        obj.metadata.namespace.as_deref()?,
        obj.metadata.name.as_deref()?
    );
    let network = obj.data["spec"]["config"].as_str().and_then(network_view);
    Some((key, network))
}

/// The stations of each remote VTEP of each overlay: `(overlay, VTEP
/// address)` to the stations, sorted, each (MAC, VLAN) once.
pub type Stations = BTreeMap<(String, IpAddr), Vec<RemoteStation>>;

/// The stations behind each of `vteps` (remote node name to its VTEP
/// address) on each of `overlays` (name to its VLANs: empty for an
/// untagged overlay): the pods on that node with an attachment to a
/// network of the overlay whose MAC is known. A pod on a VLAN the overlay
/// does not carry across (a tagged network on an untagged overlay, an
/// untagged one or another VLAN on a trunked one) is left out, as are
/// addresses that cannot be a station's.
pub fn stations<'a>(
    overlays: &BTreeMap<String, Vec<u16>>,
    vteps: &BTreeMap<String, IpAddr>,
    pods: impl IntoIterator<Item = &'a PodView>,
    networks: &BTreeMap<String, Network>,
) -> Stations {
    let mut out = Stations::new();
    for pod in pods {
        let Some(addr) = pod.node.as_ref().and_then(|n| vteps.get(n)) else {
            continue;
        };
        for a in &pod.networks {
            let Some(net) = networks
                .get(&a.network)
                .filter(|n| n.result_mac && !n.trunk)
            else {
                continue;
            };
            let Some(vlans) = overlays.get(&net.overlay) else {
                continue;
            };
            let carried = match net.vlan {
                None => vlans.is_empty(),
                Some(v) => vlans.contains(&v),
            };
            let Some(mac) = a
                .mac
                .filter(|m| carried && RemoteStation::is_station_mac(m))
            else {
                continue;
            };
            let ips = a
                .ips
                .iter()
                .copied()
                .filter(RemoteStation::is_station_address);
            let list = out.entry((net.overlay.clone(), *addr)).or_default();
            match list.iter_mut().find(|s| s.mac == mac && s.vlan == net.vlan) {
                Some(s) => s.ips.extend(ips),
                None => list.push(RemoteStation {
                    mac,
                    vlan: net.vlan,
                    ips: ips.collect(),
                }),
            }
        }
    }
    for list in out.values_mut() {
        for s in list.iter_mut() {
            s.ips.sort();
            s.ips.dedup();
        }
        list.sort_by_key(|s| (s.vlan, s.mac.0));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::Attachment;

    fn pod(name: &str, node: &str, nets: &[(&str, &str, &[&str])]) -> PodView {
        PodView {
            namespace: "default".into(),
            name: name.into(),
            node: Some(node.into()),
            networks: nets
                .iter()
                .map(|(network, mac, ips)| Attachment {
                    network: (*network).into(),
                    interface: "net1".into(),
                    mac: mac.parse().ok(),
                    ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
                })
                .collect(),
            ..PodView::default()
        }
    }

    #[test]
    fn a_nad_names_its_overlay_by_physnet_or_bridge_and_says_whether_the_mac_is_known() {
        let n = network_view(
            r#"{"cniVersion":"0.4.0","name":"o","type":"switchyard","physnet":"overlay"}"#,
        )
        .unwrap();
        assert_eq!(
            n,
            Network {
                overlay: "overlay".into(),
                vlan: None,
                trunk: false,
                result_mac: true
            }
        );
        let n = network_view(
            r#"{"cniVersion":"1.0.0","name":"o","plugins":[{"type":"switchyard","bridge":"ov","vlan":100,"pin":"first"},{"type":"tuning"}]}"#,
        )
        .unwrap();
        assert_eq!(
            (n.overlay.as_str(), n.vlan, n.result_mac),
            ("ov", Some(100), false)
        );
        // The plugin's defaults: bridge `default`; a null trunk is none.
        let n = network_view(r#"{"type":"switchyard","trunk":null,"vlan":null}"#).unwrap();
        assert_eq!(
            (n.overlay.as_str(), n.vlan, n.trunk),
            ("default", None, false)
        );
        assert!(network_view(r#"{"type":"macvlan","master":"eth0"}"#).is_none());
        assert!(network_view(r#"{"type":"switchyard","vlan":70000,"bridge":"b"}"#).is_none());
        assert!(network_view("").is_none());
    }

    #[test]
    fn each_remote_nodes_pods_are_its_vteps_stations_on_the_overlays_their_networks_are_on() {
        let overlays = BTreeMap::from([("ov".to_string(), vec![]), ("tr".to_string(), vec![100])]);
        let vteps: BTreeMap<String, IpAddr> = [("n2", "192.0.2.2"), ("n3", "192.0.2.3")]
            .into_iter()
            .map(|(n, a)| (n.to_string(), a.parse().unwrap()))
            .collect();
        let net = |overlay: &str, vlan: Option<u16>, result_mac: bool| Network {
            overlay: overlay.into(),
            vlan,
            trunk: false,
            result_mac,
        };
        let networks = BTreeMap::from([
            ("default/ov".to_string(), net("ov", None, true)),
            ("default/ov-tagged".to_string(), net("ov", Some(5), true)),
            ("default/tr-100".to_string(), net("tr", Some(100), true)),
            ("default/tr-200".to_string(), net("tr", Some(200), true)),
            ("default/ov-first".to_string(), net("ov", None, false)),
            ("default/elsewhere".to_string(), net("other", None, true)),
        ]);
        let pods = [
            pod(
                "a",
                "n2",
                &[
                    (
                        "default/ov",
                        "02:00:00:00:00:0a",
                        &["10.66.2.5", "fd66:0:0:2::5"],
                    ),
                    ("default/tr-100", "02:00:00:00:01:0a", &["10.1.0.5"]),
                ],
            ),
            pod(
                "b",
                "n2",
                &[(
                    "default/ov",
                    "02:00:00:00:00:0b",
                    &["10.66.2.6", "224.0.0.1"],
                )],
            ),
            // Not carried, not known, not ours, not remote.
            pod(
                "c",
                "n3",
                &[
                    ("default/ov-tagged", "02:00:00:00:00:0c", &["10.66.3.5"]),
                    ("default/tr-200", "02:00:00:00:00:0d", &["10.66.3.6"]),
                    ("default/ov-first", "02:00:00:00:00:0e", &["10.66.3.7"]),
                    ("default/elsewhere", "02:00:00:00:00:0f", &["10.66.3.8"]),
                    ("default/ov", "01:00:5e:00:00:01", &["10.66.3.9"]),
                    ("default/unknown", "02:00:00:00:00:10", &["10.66.3.10"]),
                ],
            ),
            pod(
                "d",
                "n1",
                &[("default/ov", "02:00:00:00:00:11", &["10.66.1.5"])],
            ),
        ];
        let got = stations(&overlays, &vteps, &pods, &networks);
        let n2: IpAddr = "192.0.2.2".parse().unwrap();
        let st = |mac: &str, vlan: Option<u16>, ips: &[&str]| RemoteStation {
            mac: mac.parse().unwrap(),
            vlan,
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
        };
        assert_eq!(
            got,
            Stations::from([
                (
                    ("ov".to_string(), n2),
                    vec![
                        st("02:00:00:00:00:0a", None, &["10.66.2.5", "fd66:0:0:2::5"]),
                        st("02:00:00:00:00:0b", None, &["10.66.2.6"]),
                    ]
                ),
                (
                    ("tr".to_string(), n2),
                    vec![st("02:00:00:00:01:0a", Some(100), &["10.1.0.5"])]
                ),
            ])
        );
    }
}
