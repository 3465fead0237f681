//! Compiles the kubelet Pod Resources API .proto with protox (no `protoc`
//! needed) and generates the tonic client (and the server the tests'
//! kubelet stand-in serves).

#[cfg(feature = "kubelet")]
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/podresources_v1.proto";
    println!("cargo:rerun-if-changed={proto}");
    let fds = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(fds)?;
    Ok(())
}

/// Without the `kubelet` feature there is no client to generate.
#[cfg(not(feature = "kubelet"))]
fn main() {}
