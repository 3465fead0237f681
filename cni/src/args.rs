//! `CNI_ARGS`: `KEY=VALUE` pairs separated by `;`.

use crate::error::{CniError, INVALID_ENV};

/// The keys this plugin reads from `CNI_ARGS`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CniArgs {
    /// `K8S_POD_UID`.
    pub pod_uid: Option<String>,
    /// `K8S_POD_NAME`.
    pub pod_name: Option<String>,
    /// `K8S_POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
    /// `MAC`.
    pub mac: Option<String>,
}

impl CniArgs {
    /// Parses `CNI_ARGS`. Unknown keys are ignored (runtimes pass
    /// `IgnoreUnknown=1` and keys meant for other plugins).
    pub fn parse(s: &str) -> Result<CniArgs, CniError> {
        let mut a = CniArgs::default();
        for pair in s.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| {
                CniError::new(INVALID_ENV, format!("CNI_ARGS: {pair:?} is not KEY=VALUE"))
            })?;
            let slot = match k {
                "K8S_POD_UID" => &mut a.pod_uid,
                "K8S_POD_NAME" => &mut a.pod_name,
                "K8S_POD_NAMESPACE" => &mut a.pod_namespace,
                "MAC" => &mut a.mac,
                _ => continue,
            };
            *slot = Some(v.to_string()).filter(|v| !v.is_empty());
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_args() {
        let a = CniArgs::parse(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;K8S_POD_INFRA_CONTAINER_ID=x;K8S_POD_UID=1234-ab",
        )
        .unwrap();
        assert_eq!(a.pod_uid.as_deref(), Some("1234-ab"));
        assert_eq!(a.pod_name.as_deref(), Some("p"));
        assert_eq!(CniArgs::parse("").unwrap(), CniArgs::default());
        assert_eq!(CniArgs::parse("nokey").unwrap_err().code, INVALID_ENV);
    }
}
