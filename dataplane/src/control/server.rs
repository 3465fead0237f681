//! The control socket listener: one thread per client connection (at most
//! [`MAX_CLIENTS`]) hands each request to the daemon loop and writes back its
//! answer.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::Shutdown;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam::channel::{bounded, Sender};
use tracing::{debug, warn};

use super::takeover;
use crate::reactor::Waker;
use switchyard_api::{ApiError, ErrorCode, Request, Response};

/// A request on its way to the daemon loop, with the way back.
pub struct Call {
    /// The request.
    pub request: Request,
    /// Where the answer goes.
    pub reply: Sender<Answer>,
    /// The connection itself, for a takeover: the daemon carries on the
    /// conversation (nothing is written to it here).
    pub conn: Option<UnixStream>,
}

/// What the daemon loop answers a call with.
pub enum Answer {
    /// One answer line.
    Now(Response),
    /// A job that writes the answer itself, on the connection's own thread,
    /// then ends the connection: a capture streams frames, a trace waits
    /// for its frames. The daemon loop is free meanwhile.
    Stream(Box<dyn StreamJob>),
}

/// An answer that takes time, run on the client connection's thread.
pub trait StreamJob: Send {
    /// Writes the answer (and whatever follows it) to `conn`.
    fn run(self: Box<Self>, conn: &mut UnixStream);
}

/// Streamed answers (captures, traces) being written.
static STREAMING: AtomicUsize = AtomicUsize::new(0);

/// How many streamed answers (captures, traces) are still being written;
/// each ends once the data plane is stopping.
pub fn streaming() -> usize {
    STREAMING.load(Ordering::Acquire)
}

/// Requests read and not yet answered.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
/// The switch takes no more requests (it was taken over or stops): each
/// one read is answered `Unavailable`, so its client asks again.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// The switch takes no more requests: see [`STOPPING`].
pub fn stop_taking() {
    STOPPING.store(true, Ordering::Release);
}

/// How many requests were read and are not yet answered.
pub fn in_flight() -> usize {
    IN_FLIGHT.load(Ordering::Acquire)
}

/// Counts a request in flight until it is answered (dropped).
struct InFlight;

impl InFlight {
    fn new() -> InFlight {
        IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The answer to a request the switch does not take any more.
pub fn unavailable() -> Response {
    Response::err(ApiError::new(
        ErrorCode::Unavailable,
        "the switch was taken over or is stopping: nothing done, ask again",
    ))
}

/// Longest request line accepted: a port's policy names each peer pod's
/// address, and a policy over a thousand pods with a few rules is hundreds
/// of KiB (64 KiB refused a port 1000 rules). The socket is root's (or its
/// group's), so this bounds a broken client, not a hostile one.
pub const MAX_REQUEST: usize = 8 << 20;

/// Binds the control socket (replacing a stale one; refusing a live one),
/// readable and writable by its owner only.
pub fn bind(path: &Path, group: Option<u32>) -> std::io::Result<UnixListener> {
    use crate::port::socket::endpoint::listen;
    // Connecting needs write permission: root only, or root and `group`.
    let fd = listen(
        nix::sys::socket::SockType::Stream,
        &switchyard_api::SocketAddr::Path(path.to_path_buf()),
        Some(0o600),
        group,
    )
    .map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => std::io::Error::new(
            e.kind(),
            format!(
                "{} is in use: is another switchyard running?",
                path.display()
            ),
        ),
        _ => e,
    })?;
    let l = UnixListener::from(fd);
    // Served by a thread of its own that waits in accept().
    l.set_nonblocking(false)?;
    Ok(l)
}

/// Client connections served at once: one more closes the oldest.
pub const MAX_CLIENTS: usize = 64;

/// Serves connections until the process exits. Each client has a thread of
/// its own, so a slow or stalled client delays nobody else; their number is
/// bounded by [`MAX_CLIENTS`].
///
/// One takeover at a time: `taking_over` is set when a takeover request is
/// handed to the daemon (which clears it if the takeover fails); another
/// one meanwhile is refused at once.
pub fn serve(
    listener: UnixListener,
    calls: Sender<Call>,
    waker: Arc<Waker>,
    taking_over: Arc<AtomicBool>,
) {
    let live: Arc<Mutex<VecDeque<(u64, UnixStream)>>> = Arc::default();
    for (id, conn) in (0u64..).zip(listener.incoming()) {
        let Ok(conn) = conn else { continue };
        {
            let mut l = live.lock().unwrap_or_else(|e| e.into_inner());
            while l.len() >= MAX_CLIENTS {
                if let Some((_, oldest)) = l.pop_front() {
                    warn!("{MAX_CLIENTS} API clients connected: closing the oldest");
                    let _ = oldest.shutdown(Shutdown::Both);
                }
            }
            if let Ok(c) = conn.try_clone() {
                l.push_back((id, c));
            }
        }
        let (calls, waker, live) = (calls.clone(), waker.clone(), live.clone());
        let taking_over = taking_over.clone();
        let _ = std::thread::Builder::new()
            .name("sy-api-conn".into())
            .spawn(move || {
                handle(conn, calls, waker, &taking_over);
                live.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .retain(|(i, _)| *i != id);
            });
    }
}

fn handle(conn: UnixStream, calls: Sender<Call>, waker: Arc<Waker>, taking_over: &AtomicBool) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(300)));
    // A client that does not read its answers loses its connection.
    let _ = conn.set_write_timeout(Some(Duration::from_secs(5)));
    let Ok(w) = conn.try_clone() else { return };
    let mut writer = w;
    let mut reader = BufReader::new(conn).take(MAX_REQUEST as u64);
    loop {
        let mut line = String::new();
        match reader.read_line(&mut line) {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if !line.ends_with('\n') && line.len() >= MAX_REQUEST {
            let _ = send(
                &mut writer,
                &Response::err(ApiError::new(ErrorCode::BadRequest, "request too long")),
            );
            return;
        }
        reader.set_limit(MAX_REQUEST as u64);
        let resp = match serde_json::from_str::<Request>(line.trim()) {
            Err(e) => Response::err(ApiError::new(
                ErrorCode::BadRequest,
                format!("bad request: {e}"),
            )),
            Ok(Request::Takeover { .. } | Request::StandDown) if !same_user(&writer) => {
                // Either gives away every pod's memory and connections, or
                // stops them all: the switch's own user only, not a member
                // of the control socket's group.
                warn!("a takeover or stand-down asked by another user: refused");
                Response::err(ApiError::new(
                    ErrorCode::PermissionDenied,
                    "only the switch's own user may take it over or stop it",
                ))
            }
            Ok(request @ Request::Takeover { .. }) => {
                if taking_over.swap(true, Ordering::AcqRel) {
                    warn!("a takeover asked while another is in progress: refused");
                    let _ = takeover::send(&writer, &takeover::Step::Busy, &[]);
                    return;
                }
                let (tx, _) = bounded(1);
                let conn = Some(writer);
                if calls
                    .send(Call {
                        request,
                        reply: tx,
                        conn,
                    })
                    .is_ok()
                {
                    waker.wake();
                }
                return;
            }
            Ok(request) => {
                debug!(?request, "api call");
                // Counted from before the daemon can see it until its
                // answer is written: a switch that goes waits for it.
                let flight = InFlight::new();
                let resp = if STOPPING.load(Ordering::Acquire) {
                    unavailable()
                } else {
                    let (tx, rx) = bounded(1);
                    if calls
                        .send(Call {
                            request,
                            reply: tx,
                            conn: None,
                        })
                        .is_err()
                    {
                        return;
                    }
                    waker.wake();
                    match rx.recv_timeout(Duration::from_secs(60)) {
                        Ok(Answer::Now(r)) => r,
                        Ok(Answer::Stream(job)) => {
                            drop(flight);
                            STREAMING.fetch_add(1, Ordering::AcqRel);
                            job.run(&mut writer);
                            let _ = writer.shutdown(Shutdown::Both);
                            STREAMING.fetch_sub(1, Ordering::AcqRel);
                            return;
                        }
                        Err(_) => {
                            warn!("daemon did not answer an API call");
                            Response::err(ApiError::new(
                                ErrorCode::Internal,
                                "daemon did not answer",
                            ))
                        }
                    }
                };
                let sent = send(&mut writer, &resp);
                drop(flight);
                if sent.is_err() {
                    return;
                }
                continue;
            }
        };
        if send(&mut writer, &resp).is_err() {
            return;
        }
    }
}

/// Whether the process at the other end of `conn` runs as this process's
/// user (or root).
fn same_user(conn: &UnixStream) -> bool {
    use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
    getsockopt(conn, PeerCredentials)
        .is_ok_and(|c| c.uid() == 0 || c.uid() == nix::unistd::geteuid().as_raw())
}

/// Writes one answer line.
pub fn send(w: &mut UnixStream, r: &Response) -> std::io::Result<()> {
    let mut b = serde_json::to_vec(r).map_err(std::io::Error::other)?;
    b.push(b'\n');
    w.write_all(&b)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::bind;

    #[test]
    fn the_socket_is_root_only_or_root_and_the_configured_group() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.sock");
        let l = bind(&p, None).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        drop(l);
        let _l = bind(&p, Some(4242)).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o660);
        if nix::unistd::geteuid().is_root() {
            assert_eq!(m.gid(), 4242);
        }
    }
}
