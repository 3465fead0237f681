//! A CA and a server certificate it signed, for the tests' HTTPS servers
//! (the API server stand-in, and the webhook's tests).

use std::path::Path;

/// Writes `ca.crt`, `tls.crt` and `tls.key` into `dir`: a CA called
/// `ca_name`, and a certificate it signed for `names` (DNS names or IP
/// addresses) with its key.
pub fn write_ca_and_cert(dir: &Path, ca_name: &str, names: &[&str]) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, ca_name);
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert =
        rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .unwrap()
            .signed_by(&key, &ca_cert, &ca_key)
            .unwrap();
    std::fs::write(dir.join("ca.crt"), ca_cert.pem()).unwrap();
    std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
}
