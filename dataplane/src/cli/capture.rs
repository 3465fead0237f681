//! `capture`: the daemon's pcapng (or pcap) stream, written to a file or
//! standard output as it comes.

use anyhow::Context;

use switchyard_api::{Client, Request};

/// Streams a capture to `out` (`-`: standard output) until the daemon
/// ends it.
pub(crate) fn capture(
    mut client: Client,
    req: Request,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    // A capture may stay quiet for as long as the port does.
    client.set_timeout(std::time::Duration::from_secs(365 * 24 * 3600))?;
    let mut sink: Box<dyn Write> = if out.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(
            std::fs::File::create(out)
                .with_context(|| format!("-w: cannot create {}", out.display()))?,
        )
    };
    let (armed, conn) = client.call_stream(&req)?;
    // Armed: said on stderr as tcpdump says "listening on", so a reader (or
    // a script) knows no frame from now on is missed.
    if let Ok(info) = serde_json::from_value::<switchyard_api::CaptureInfo>(armed) {
        let format = match info.format {
            switchyard_api::CaptureFormat::Pcapng => "pcapng",
            switchyard_api::CaptureFormat::Pcap => "pcap",
        };
        eprintln!(
            "capturing on {}, {format}, snapshot length {} bytes",
            info.port, info.snaplen
        );
    }
    // Written as it comes, unbuffered: Ctrl-C loses nothing already read.
    let mut buf = vec![0u8; 256 * 1024];
    loop {
        let n = match conn.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("capture stream"),
        };
        sink.write_all(&buf[..n])?;
        sink.flush()?;
    }
    Ok(())
}
