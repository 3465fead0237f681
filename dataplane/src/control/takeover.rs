//! The takeover conversation between the running switch (old) and the one
//! replacing it (new), on a control socket connection: its steps, the
//! state the old one hands over, and their framing with file descriptors.
//!
//! ```text
//! new: {"op":"takeover","version":V,"prepare":true}\n  (an API request line)
//! old: saves its quiet ports (no connection), forwarding on
//! old: Prepare (+ their fds)            or Refused
//! new: builds those ports and the bridges (its workers paused)
//! new: Prepared                         or Refused
//! old: pauses its workers at a burst boundary, saves the other ports
//! old: State (+ their fds)              or Refused
//! new: maps the memory, builds its ports and queues, the MAC tables
//! new: Ready                            or Refused
//! old: Go
//! new: Running (its confirmation), then resumes its workers and serves
//!      the API                          old: exits, leaving every socket
//! ```
//!
//! Without `prepare` (a switch before it asks so, and one that finds the
//! running switch refusing the field asks again so), the old switch sends
//! no Prepare: every port is in the State. A quiet port stays so until the
//! State, because only the old switch's daemon thread changes it (accepts,
//! connects, handshakes), and that thread is in the conversation; the
//! State refuses the takeover if one did change.
//!
//! The ports are the new switch's once its confirmation reaches the old
//! one, and not before: the new one runs nothing until it has written it,
//! and the old one, giving up on it, first closes its receiving side, so a
//! confirmation either arrives or fails to be written. Any failure before
//! that leaves the old switch running the ports, its queues taken up where
//! the rings are.
//!
//! Each message is a frame: `SYHO`, the body's length and the number of
//! fds (`u32` little-endian each), then the fds in batches of at most
//! [`FDS_PER_BATCH`], each batch on one byte of its own, then the body
//! (JSON). A switch that does not know takeovers answers the request with
//! an API error line instead, which [`recv`] reports as such.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};
use serde::{Deserialize, Serialize};

use crate::config::PortSpec;
use crate::dataplane::BridgeTotals;
use crate::port::takeover::{FdRef, Saved};
use switchyard_api::PortTotals;

pub use crate::port::takeover::VERSION;

/// Fds sent with one byte: below the kernel's `SCM_MAX_FD` (253).
pub const FDS_PER_BATCH: usize = 250;
/// Most fds one frame may carry.
pub const MAX_FDS: usize = 64 * 1024;
/// Largest frame body.
pub const MAX_BODY: usize = 256 << 20;
const MAGIC: [u8; 4] = *b"SYHO";

/// A step of the conversation.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// Old to new, when the new one asked for it, before the old one
    /// pauses: the ports that cannot change meanwhile ([`Port::quiet`]:
    /// no connection) and the bridges without their MAC tables, as a
    /// [`TakeoverState`] with its fds; the new one takes them up while the
    /// old one forwards.
    ///
    /// [`Port::quiet`]: crate::port::Port::quiet
    Prepare(serde_json::Value),
    /// New to old: the ports of [`Step::Prepare`] are taken up.
    Prepared,
    /// Old to new, its workers paused: the state (a [`TakeoverState`],
    /// read once its version is known to be [`VERSION`]); the fds it names
    /// come with the frame. After a [`Step::Prepare`], it holds the other
    /// ports, the MAC tables and what the prepared ports counted since.
    State(serde_json::Value),
    /// New to old: every port is taken up, the workers wait for the go.
    Ready,
    /// Old to new: confirm, and run.
    Go,
    /// New to old: the confirmation; the new switch runs from here.
    Running,
    /// Either way: no takeover, and why.
    Refused {
        /// Why.
        reason: String,
    },
    /// Old to new: another takeover is under way; ask again later.
    Busy,
}

/// What the old switch hands over.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TakeoverState {
    /// [`VERSION`].
    pub version: u32,
    /// The old process's id (for the log).
    pub pid: u32,
    /// Its configuration, as it runs it: the new one must run the same.
    pub config: serde_json::Value,
    /// The control socket's listener.
    pub control_listener: FdRef,
    /// The metrics endpoint's listener, if there is one.
    pub metrics_listener: Option<FdRef>,
    /// Bridges, in the order they were made.
    pub bridges: Vec<SavedBridge>,
    /// Ports, in slot order.
    pub ports: Vec<SavedPort>,
    /// Persisted ports that could not be made, and why.
    pub unrestored: Vec<(PortSpec, String)>,
    /// In the state after a [`Step::Prepare`]: what ports taken up then
    /// counted since (by name; those that counted nothing are left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub counted: Vec<(String, PortTotals)>,
    /// The node's slices of the overlays' addresses, as the old switch
    /// hands them out when it pauses (`None`: none, or a switch before
    /// them; the new one keeps what the state file said).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay_slices:
        Option<std::collections::BTreeMap<String, switchyard_api::overlay::SavedSlice>>,
    /// The stations behind the overlays' remote VTEPs (left out when
    /// none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stations: Vec<SavedStations>,
}

/// The stations behind one remote VTEP, handed over.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedStations {
    /// The overlay.
    pub overlay: String,
    /// The remote VTEP.
    pub remote: std::net::IpAddr,
    /// Its stations.
    pub stations: Vec<switchyard_api::RemoteStation>,
}

/// A bridge handed over.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedBridge {
    /// Name.
    pub name: String,
    /// From the config file (not persisted).
    pub from_config: bool,
    /// Its counters so far.
    pub totals: BridgeTotals,
    /// Its MAC table.
    pub macs: Vec<SavedMac>,
    /// The connections L3/L4 policy allowed in it (switches before policy
    /// send none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub connections: Vec<crate::switch::policy::conntrack::ConnRecord>,
}

/// A MAC table entry handed over.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedMac {
    /// Address.
    pub mac: switchyard_api::MacAddr,
    /// VLAN (0 = untagged).
    pub vlan: u16,
    /// The port's name.
    pub port: String,
    /// Seconds since a frame came from it.
    pub age: u32,
    /// Pinned to its port.
    pub pinned: bool,
}

/// A port handed over.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedPort {
    /// Its spec, as the old switch holds it (a pinned MAC included).
    pub spec: PortSpec,
    /// From the config file (not persisted).
    pub from_config: bool,
    /// Its counters so far.
    pub totals: PortTotals,
    /// The kind's own state ([`crate::port::Port::save`]).
    pub state: Saved,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The other side closed the connection.
    #[error("the other switch closed the connection")]
    Closed,
    /// The other side answered with something other than a frame (an old
    /// switch's API error line, say).
    #[error("the other switch answered {0:?}")]
    NotAFrame(String),
    /// A frame broke the bounds or the format.
    #[error("bad takeover frame: {0}")]
    Bad(String),
    /// A socket call failed (a timeout included).
    #[error("{0}")]
    Io(#[from] io::Error),
}

/// Sends `step` with `fds` (the caller keeps them open).
pub fn send(conn: &UnixStream, step: &Step, fds: &[RawFd]) -> io::Result<()> {
    let body = serde_json::to_vec(step).map_err(io::Error::other)?;
    let mut head = Vec::with_capacity(12);
    head.extend_from_slice(&MAGIC);
    head.extend_from_slice(&(body.len() as u32).to_le_bytes());
    head.extend_from_slice(&(fds.len() as u32).to_le_bytes());
    let mut w = conn;
    w.write_all(&head)?;
    for batch in fds.chunks(FDS_PER_BATCH) {
        let rights = [ControlMessage::ScmRights(batch)];
        let n = sendmsg::<UnixAddr>(
            conn.as_raw_fd(),
            &[IoSlice::new(b"F")],
            &rights,
            MsgFlags::MSG_NOSIGNAL,
            None,
        )?;
        if n != 1 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "fd batch not sent",
            ));
        }
    }
    w.write_all(&body)
}

/// A frame received: its step and the fds that came with it.
pub type Received = (Step, Vec<OwnedFd>);

/// Receives one frame: its step and the fds that came with it.
pub fn recv(conn: &UnixStream) -> Result<Received, WireError> {
    let mut r = conn;
    let mut magic = [0u8; 4];
    read_exact(&mut r, &mut magic)?;
    if magic != MAGIC {
        // A line, such as an API error from a switch without takeovers.
        let mut line = magic.to_vec();
        let mut byte = [0u8; 1];
        while line.len() < 4096 && !line.ends_with(b"\n") {
            match r.read(&mut byte) {
                Ok(1) => line.push(byte[0]),
                _ => break,
            }
        }
        return Err(WireError::NotAFrame(
            String::from_utf8_lossy(&line).trim().to_string(),
        ));
    }
    let mut head = [0u8; 8];
    read_exact(&mut r, &mut head)?;
    let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let nfds = u32::from_le_bytes([head[4], head[5], head[6], head[7]]) as usize;
    if len > MAX_BODY || nfds > MAX_FDS {
        return Err(WireError::Bad(format!("{len} bytes and {nfds} fds")));
    }
    let mut fds = Vec::with_capacity(nfds);
    while fds.len() < nfds {
        let mut byte = [0u8; 1];
        let mut iov = [IoSliceMut::new(&mut byte)];
        let mut cmsg = nix::cmsg_space!([RawFd; FDS_PER_BATCH]);
        let m = recvmsg::<UnixAddr>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(io::Error::from)?;
        let (got, truncated) = (m.bytes, m.flags.contains(MsgFlags::MSG_CTRUNC));
        let mut batch = 0;
        for c in m.cmsgs().map_err(io::Error::from)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: the kernel just installed this descriptor in
                    // our table for us.
                    fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
                    batch += 1;
                }
            }
        }
        if got == 0 {
            return Err(WireError::Closed);
        }
        if truncated || batch == 0 || byte != *b"F" {
            return Err(WireError::Bad(format!(
                "an fd batch of {batch} fds{}",
                if truncated { ", truncated" } else { "" }
            )));
        }
    }
    if fds.len() != nfds {
        return Err(WireError::Bad(format!(
            "{} fds where {nfds} were announced",
            fds.len()
        )));
    }
    let mut body = vec![0u8; len];
    read_exact(&mut r, &mut body)?;
    let step = serde_json::from_slice(&body).map_err(|e| WireError::Bad(e.to_string()))?;
    Ok((step, fds))
}

fn read_exact(r: &mut &UnixStream, buf: &mut [u8]) -> Result<(), WireError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => WireError::Closed,
        _ => WireError::Io(e),
    })
}

/// Where two configurations differ, as paths (`dataplane.workers`), at
/// most a few.
pub fn config_differences(ours: &serde_json::Value, theirs: &serde_json::Value) -> Vec<String> {
    fn walk(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
        use serde_json::Value;
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    let null = Value::Null;
                    walk(
                        &p,
                        x.get(k).unwrap_or(&null),
                        y.get(k).unwrap_or(&null),
                        out,
                    );
                }
            }
            (a, b) if a != b => out.push(path.to_string()),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk("", ours, theirs, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn frames_carry_their_fds_in_batches() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = std::fs::File::open("/dev/null").unwrap();
        let raw = vec![file.as_raw_fd(); FDS_PER_BATCH * 2 + 3];
        let step = Step::State(serde_json::json!({"x": 1}));
        let t = std::thread::spawn(move || send(&a, &step, &raw).map(|()| a));
        let (got, fds) = recv(&b).unwrap();
        let _a = t.join().unwrap().unwrap();
        assert!(matches!(got, Step::State(v) if v["x"] == 1));
        assert_eq!(fds.len(), FDS_PER_BATCH * 2 + 3);
        assert!(fds.iter().all(|f| f.as_fd().try_clone_to_owned().is_ok()));
    }

    #[test]
    fn a_line_instead_of_a_frame_and_a_closed_peer_are_told_apart() {
        let (a, b) = UnixStream::pair().unwrap();
        (&a).write_all(b"{\"ok\":false}\n").unwrap();
        assert!(matches!(recv(&b), Err(WireError::NotAFrame(l)) if l == "{\"ok\":false}"));
        drop(a);
        assert!(matches!(recv(&b), Err(WireError::Closed)));
    }

    #[test]
    fn config_differences_name_their_paths() {
        let a = serde_json::json!({"a": 1, "d": {"w": 2, "c": [1]}});
        let b = serde_json::json!({"a": 1, "d": {"w": 3, "c": [1]}, "n": true});
        assert_eq!(config_differences(&a, &b), ["d.w", "n"]);
        assert!(config_differences(&a, &a).is_empty());
    }
}
