//! Strict validation against the Kubernetes schemas, by the
//! `kubernetes-validate` package (PyPI; `scripts/test.sh` installs it).
//! (The webhook tests include this file with `#[path]`.)

use std::path::PathBuf;
use std::process::Command;

/// Panics, with the validator's words, unless every object in `files`
/// passes `kubernetes-validate --strict`.
pub fn validate_strictly(files: &[PathBuf]) {
    let out = Command::new("python3")
        .args(["-m", "kubernetes_validate", "--strict", "--quiet"])
        .args(files)
        .output()
        .expect("python3");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("No module named kubernetes_validate"),
        "kubernetes-validate is missing: pip install kubernetes-validate (./scripts/test.sh does)"
    );
    assert!(out.status.success(), "{text}");
    assert!(!text.contains("ERROR"), "{text}");
}
