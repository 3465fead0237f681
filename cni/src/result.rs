//! CNI results, emitted in the format of the requested version.

use serde::{Deserialize, Serialize};

/// An interface in a result.
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

/// An IP configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// CIDR address.
    pub address: String,
    /// Gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// A result (the 1.x shape; [`CniResult::to_version`] adapts it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CniResult {
    /// Interfaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// IPs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<IpConfig>,
    /// Routes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<serde_json::Value>,
    /// DNS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<serde_json::Value>,
}

impl CniResult {
    /// Reads a result of any supported version (e.g. from IPAM or prevResult).
    pub fn from_value(v: &serde_json::Value) -> Result<CniResult, serde_json::Error> {
        CniResult::deserialize(v)
    }

    /// The JSON of this result for `version`.
    pub fn to_version(&self, version: &str) -> serde_json::Value {
        let mut r = self.clone();
        let v1_1 = version == "1.1.0";
        if !v1_1 {
            for i in &mut r.interfaces {
                i.socket_path = None;
            }
        }
        let mut v = serde_json::to_value(&r).unwrap_or_default();
        v["cniVersion"] = version.into();
        if version.starts_with("0.") {
            // 0.3.x/0.4.0 name each address's IP version.
            if let Some(ips) = v.get_mut("ips").and_then(|i| i.as_array_mut()) {
                for ip in ips {
                    let six = ip["address"].as_str().is_some_and(|a| a.contains(':'));
                    ip["version"] = if six { "6" } else { "4" }.into();
                }
            }
        }
        if v.get("dns").is_none() {
            v["dns"] = serde_json::json!({});
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_differ_where_the_spec_does() {
        let r = CniResult {
            interfaces: vec![Interface {
                name: "net1".into(),
                mac: Some("02:00:00:00:00:01".into()),
                sandbox: Some("/var/run/netns/x".into()),
                socket_path: Some("/run/s.sock".into()),
            }],
            ips: vec![IpConfig {
                address: "10.1.0.2/24".into(),
                gateway: None,
                interface: Some(0),
            }],
            ..Default::default()
        };
        let v = r.to_version("1.1.0");
        assert_eq!(v["interfaces"][0]["socketPath"], "/run/s.sock");
        let v = r.to_version("1.0.0");
        assert!(v["interfaces"][0].get("socketPath").is_none());
        assert!(v["ips"][0].get("version").is_none());
        let v = r.to_version("0.4.0");
        assert_eq!(v["ips"][0]["version"], "4");
        let back = CniResult::from_value(&v).unwrap();
        assert_eq!(back.ips[0].address, "10.1.0.2/24");
    }
}
