//! A client of the control socket (the CLI, the CNI plugin and the device
//! plugin use it).

use std::io::{BufRead, BufReader, ErrorKind, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::call::Call;
use crate::protocol::{ApiError, ErrorCode, Request, Response};

/// Errors talking to the daemon.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket cannot be reached.
    #[error("cannot reach switchyard at {path}: {cause}")]
    Connect {
        /// Socket path.
        path: String,
        /// Cause (in the message, not repeated as a `source()`).
        cause: std::io::Error,
    },
    /// The conversation broke.
    #[error("control socket: {0}")]
    Io(std::io::Error),
    /// The answer is not JSON we understand.
    #[error("bad answer from switchyard: {0}")]
    BadAnswer(String),
    /// The daemon refused the request.
    #[error(transparent)]
    Api(#[from] ApiError),
}

// Each error says its cause once, in its message: none is also a
// `source()`, so a caller printing the chain (anyhow's `{:#}`) does not
// print it twice.
impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> ClientError {
        ClientError::Io(e)
    }
}

/// How long a call asks again while the switch is being taken over or
/// restarted (its socket refused, gone, or closed before an answer; or
/// answered [`ErrorCode::Unavailable`]) before it gives up.
pub const RETRY_FOR: Duration = Duration::from_secs(15);

/// A connection to the daemon. A call the switch did not take (it was
/// taken over or is restarting) is asked again on a new connection, for
/// up to [`RETRY_FOR`]: a takeover or a restart costs a call latency, not
/// an error.
pub struct Client {
    path: PathBuf,
    conn: Option<(BufReader<UnixStream>, UnixStream)>,
    timeout: Duration,
    retry_for: Duration,
}

/// Why one attempt failed, and whether the switch took the request.
enum Attempt {
    /// Not taken (refused, gone, closed before an answer, or
    /// `Unavailable`): it may be asked again.
    NotTaken(ClientError),
    /// Anything else.
    Failed(ClientError),
}

impl Client {
    /// Connects to the control socket; a switch that is not there is an
    /// error now (the CLI's way: `ovs-vsctl` fails so too without
    /// `--retry`).
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let mut c = Client::lazy(path);
        c.open()?;
        Ok(c)
    }

    /// A client that connects at its first call, and asks that call again
    /// while the socket is missing or refused, as any call the switch did
    /// not take: a switch restarting (or not yet started) costs the call a
    /// latency of up to [`Client::set_retry`]'s time, not an error. The
    /// CNI plugin's way.
    pub fn lazy(path: &Path) -> Client {
        Client {
            path: path.to_path_buf(),
            conn: None,
            timeout: Duration::from_secs(60),
            retry_for: RETRY_FOR,
        }
    }

    fn open(&mut self) -> Result<(), ClientError> {
        let s = UnixStream::connect(&self.path).map_err(|cause| ClientError::Connect {
            path: self.path.display().to_string(),
            cause,
        })?;
        s.set_read_timeout(Some(self.timeout))?;
        s.set_write_timeout(Some(self.timeout))?;
        self.conn = Some((BufReader::new(s.try_clone()?), s));
        Ok(())
    }

    /// Bounds how long one call waits for the daemon's answer (60 s by
    /// default), and how long it asks again (at most that long too);
    /// health probes use a short one.
    pub fn set_timeout(&mut self, limit: Duration) -> Result<(), ClientError> {
        self.timeout = limit;
        self.retry_for = self.retry_for.min(limit);
        if let Some((_, w)) = &self.conn {
            w.set_read_timeout(Some(limit))?;
            w.set_write_timeout(Some(limit))?;
        }
        Ok(())
    }

    /// How long a call the switch did not take is asked again
    /// ([`RETRY_FOR`] by default; zero: never).
    pub fn set_retry(&mut self, retry_for: Duration) {
        self.retry_for = retry_for;
    }

    /// Sends a request and returns the `result` value. A request the switch
    /// did not take is asked again on a new connection until
    /// [`Client::set_retry`]'s time is up; a stand-down or a takeover is
    /// asked once.
    pub fn call(&mut self, req: &Request) -> Result<serde_json::Value, ClientError> {
        let once = matches!(req, Request::StandDown | Request::Takeover { .. });
        let end = Instant::now() + self.retry_for;
        let mut pause = Duration::from_millis(10);
        loop {
            match self.attempt(req) {
                Ok(v) => return Ok(v),
                Err(Attempt::NotTaken(_)) if !once && Instant::now() + pause < end => {
                    self.conn = None;
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Err(Attempt::NotTaken(e)) => {
                    // The connection is to a switch that goes, if any.
                    self.conn = None;
                    return Err(e);
                }
                Err(Attempt::Failed(e)) => {
                    if matches!(e, ClientError::Io(_) | ClientError::BadAnswer(_)) {
                        self.conn = None;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// One attempt: on the open connection, or a new one.
    fn attempt(&mut self, req: &Request) -> Result<serde_json::Value, Attempt> {
        let not_taken = |e: std::io::Error| match e.kind() {
            ErrorKind::NotFound
            | ErrorKind::ConnectionRefused
            | ErrorKind::ConnectionReset
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof => Attempt::NotTaken(ClientError::Io(e)),
            _ => Attempt::Failed(ClientError::Io(e)),
        };
        if self.conn.is_none() {
            self.open().map_err(|e| match e {
                ClientError::Connect { cause, path }
                    if matches!(
                        cause.kind(),
                        ErrorKind::NotFound | ErrorKind::ConnectionRefused
                    ) =>
                {
                    Attempt::NotTaken(ClientError::Connect { path, cause })
                }
                e => Attempt::Failed(e),
            })?;
        }
        let Some((reader, writer)) = self.conn.as_mut() else {
            return Err(Attempt::Failed(ClientError::BadAnswer(
                "not connected".into(),
            )));
        };
        let mut line = serde_json::to_vec(req)
            .map_err(|e| Attempt::Failed(ClientError::BadAnswer(e.to_string())))?;
        line.push(b'\n');
        writer.write_all(&line).map_err(not_taken)?;
        let mut answer = String::new();
        // The switch answers every request it reads, before it goes: a
        // connection that closes without an answer had it not taken.
        if reader.read_line(&mut answer).map_err(not_taken)? == 0 {
            return Err(Attempt::NotTaken(ClientError::BadAnswer(
                "connection closed".into(),
            )));
        }
        let r: Response = serde_json::from_str(&answer)
            .map_err(|e| Attempt::Failed(ClientError::BadAnswer(e.to_string())))?;
        if r.ok {
            return Ok(r.result.unwrap_or(serde_json::Value::Null));
        }
        let e = r
            .error
            .unwrap_or_else(|| ApiError::new(ErrorCode::Internal, "error without details"));
        if e.code == ErrorCode::Unavailable {
            Err(Attempt::NotTaken(ClientError::Api(e)))
        } else {
            Err(Attempt::Failed(ClientError::Api(e)))
        }
    }

    /// Sends a request whose answer line is followed by a stream of bytes
    /// (`capture`): returns the answer's `result` and the connection to
    /// read the bytes from, until it ends.
    pub fn call_stream(
        &mut self,
        req: &Request,
    ) -> Result<(serde_json::Value, &mut BufReader<UnixStream>), ClientError> {
        let v = self.call(req)?;
        match self.conn.as_mut() {
            Some((reader, _)) => Ok((v, reader)),
            None => Err(ClientError::BadAnswer("connection closed".into())),
        }
    }

    /// Sends `call`'s request and decodes its answer, of the type the
    /// request is answered with.
    pub fn ask<A: serde::de::DeserializeOwned>(
        &mut self,
        call: &Call<A>,
    ) -> Result<A, ClientError> {
        self.call_as(call.request())
    }

    /// Sends a request and decodes the result.
    pub fn call_as<T: serde::de::DeserializeOwned>(
        &mut self,
        req: &Request,
    ) -> Result<T, ClientError> {
        let v = self.call(req)?;
        serde_json::from_value(v).map_err(|e| ClientError::BadAnswer(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absent_daemon_is_named_once() {
        let d = tempfile::tempdir().unwrap();
        let e = Client::connect(&d.path().join("none.sock")).err().unwrap();
        let text = e.to_string();
        assert_eq!(text.matches("No such file").count(), 1, "{text}");
        assert!(std::error::Error::source(&e).is_none());
    }
}
