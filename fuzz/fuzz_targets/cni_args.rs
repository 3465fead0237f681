//! CNI_ARGS as set by the runtime: parsing never panics, agrees with a
//! plain model of `KEY=VALUE;...` (the last pair of a key wins, an empty
//! value is none), and what it parsed, written out again, parses the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use switchyard_cni::args::CniArgs;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let parsed = CniArgs::parse(s);
    let pairs: Vec<&str> = s.split(';').filter(|p| !p.is_empty()).collect();
    assert_eq!(
        parsed.is_ok(),
        pairs.iter().all(|p| p.contains('=')),
        "{s:?}: {parsed:?}"
    );
    let Ok(a) = parsed else {
        return;
    };
    let last = |key: &str| {
        pairs
            .iter()
            .filter_map(|p| p.split_once('='))
            .rfind(|(k, _)| *k == key)
            .and_then(|(_, v)| Some(v.to_string()).filter(|v| !v.is_empty()))
    };
    let fields = [
        ("K8S_POD_UID", &a.pod_uid),
        ("K8S_POD_NAME", &a.pod_name),
        ("K8S_POD_NAMESPACE", &a.pod_namespace),
        ("MAC", &a.mac),
    ];
    let mut again = String::from("IgnoreUnknown=1");
    for (key, value) in fields {
        assert_eq!(*value, last(key), "{s:?}: {key}");
        if let Some(v) = value {
            again.push_str(&format!(";{key}={v}"));
        }
    }
    assert_eq!(CniArgs::parse(&again).as_ref(), Ok(&a), "{again:?}");
});
