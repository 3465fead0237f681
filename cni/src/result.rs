//! CNI results, in the format of the requested version.
//!
//! A result is kept as JSON, not re-built from a narrower struct: the
//! previous plugin's result (`prevResult`) passes through whole, with fields
//! this plugin does not know (an interface's `mtu` or `pciID`, a route's
//! `mtu`, ...), and the IPAM plugin's addresses keep the shape of the version
//! it was asked for.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::error::{CniError, DECODE_FAILURE};

/// The interface this plugin adds to a result.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// Name.
    pub name: String,
    /// MAC address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Network namespace path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
    /// Socket of a userspace interface (CNI 1.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket_path: Option<String>,
}

/// The parts of a result CHECK looks at.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ResultView {
    /// Interfaces.
    #[serde(default)]
    pub interfaces: Vec<Interface>,
}

impl ResultView {
    /// Reads a result of any supported version (e.g. `prevResult`).
    pub fn from_value(v: &Value) -> Result<ResultView, serde_json::Error> {
        ResultView::deserialize(v)
    }
}

fn array<'a>(obj: &'a mut Value, key: &str) -> Result<&'a mut Vec<Value>, CniError> {
    let slot = &mut obj[key];
    if slot.is_null() {
        *slot = json!([]);
    }
    slot.as_array_mut()
        .ok_or_else(|| CniError::new(DECODE_FAILURE, format!("prevResult.{key}: not a list")))
}

/// The ADD result for `version`: `prev` (kept whole) with `iface`
/// appended, the addresses and routes of the IPAM plugin's result `ipam`
/// (its addresses pointing at `iface`), and `dns` when the netconf gives
/// one.
pub fn add_result(
    version: &str,
    prev: Option<&Value>,
    iface: &Interface,
    ipam: Option<&Value>,
    dns: Option<&Value>,
) -> Result<Value, CniError> {
    let mut r = match prev {
        Some(p) if p.is_object() => p.clone(),
        Some(_) => return Err(CniError::new(DECODE_FAILURE, "prevResult: not an object")),
        None => json!({}),
    };
    r["cniVersion"] = version.into();
    let mut iface = iface.clone();
    if version != "1.1.0" {
        iface.socket_path = None; // a 1.1 field
    }
    let interfaces = array(&mut r, "interfaces")?;
    interfaces.push(serde_json::to_value(&iface).unwrap_or_default());
    let index = interfaces.len() - 1;
    if let Some(ipam) = ipam {
        if let Some(ips) = ipam["ips"].as_array() {
            let out = array(&mut r, "ips")?;
            for ip in ips {
                let mut ip = ip.clone();
                ip["interface"] = index.into();
                out.push(ip);
            }
        }
        if let Some(routes) = ipam["routes"].as_array() {
            array(&mut r, "routes")?.extend(routes.iter().cloned());
        }
        if ipam["dns"].as_object().is_some_and(|d| !d.is_empty()) {
            r["dns"] = ipam["dns"].clone();
        }
    }
    if let Some(d) = dns {
        r["dns"] = d.clone();
    }
    if r.get("dns").is_none() {
        r["dns"] = json!({});
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface() -> Interface {
        Interface {
            name: "net1".into(),
            mac: Some("02:00:00:00:00:01".into()),
            sandbox: Some("/var/run/netns/x".into()),
            socket_path: Some("/run/s.sock".into()),
        }
    }

    #[test]
    fn previous_results_pass_through_whole() {
        let prev = json!({
            "cniVersion": "1.1.0",
            "interfaces": [{"name": "eth0", "mac": "02:11:22:33:44:55", "mtu": 9000,
                            "sandbox": "/var/run/netns/x", "pciID": "0000:01:00.1",
                            "socketPath": "/run/other.sock", "x-vendor": {"a": 1}}],
            "ips": [{"address": "10.0.0.2/24", "interface": 0}],
            "routes": [{"dst": "0.0.0.0/0", "gw": "10.0.0.1", "mtu": 1400}],
            "dns": {"nameservers": ["10.0.0.53"]},
            "x-top": true,
        });
        let ipam = json!({"cniVersion": "1.0.0",
                          "ips": [{"address": "10.1.0.2/24", "gateway": "10.1.0.1"}],
                          "routes": [{"dst": "10.2.0.0/16"}]});
        let r = add_result("1.1.0", Some(&prev), &iface(), Some(&ipam), None).unwrap();
        assert_eq!(r["interfaces"][0], prev["interfaces"][0], "kept whole");
        assert_eq!(r["x-top"], true);
        assert_eq!(r["interfaces"][1]["socketPath"], "/run/s.sock");
        assert_eq!(r["ips"][0], prev["ips"][0]);
        assert_eq!(r["ips"][1]["address"], "10.1.0.2/24");
        assert_eq!(r["ips"][1]["interface"], 1);
        assert_eq!(r["routes"][0]["mtu"], 1400);
        assert_eq!(r["routes"][1]["dst"], "10.2.0.0/16");
        assert_eq!(r["dns"]["nameservers"][0], "10.0.0.53");
    }

    #[test]
    fn versions_differ_where_the_spec_does() {
        let r = add_result("1.0.0", None, &iface(), None, None).unwrap();
        assert!(r["interfaces"][0].get("socketPath").is_none());
        assert_eq!(r["cniVersion"], "1.0.0");
        assert_eq!(r["dns"], json!({}));
        // 0.x IPAM results carry the address version, kept as they came.
        let ipam = json!({"ips": [{"version": "4", "address": "10.1.0.2/24"}]});
        let r = add_result("0.4.0", None, &iface(), Some(&ipam), None).unwrap();
        assert_eq!(r["ips"][0]["version"], "4");
        assert!(add_result("1.1.0", Some(&json!([])), &iface(), None, None).is_err());
        assert!(add_result(
            "1.1.0",
            Some(&json!({"interfaces": 3})),
            &iface(),
            None,
            None
        )
        .is_err());
    }
}
