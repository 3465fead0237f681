//! A client of the control socket (the CLI, the CNI plugin and the device
//! plugin use it).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

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

/// A connection to the daemon.
pub struct Client {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
}

impl Client {
    /// Connects to the control socket.
    pub fn connect(path: &Path) -> Result<Client, ClientError> {
        let s = UnixStream::connect(path).map_err(|cause| ClientError::Connect {
            path: path.display().to_string(),
            cause,
        })?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(Client {
            reader: BufReader::new(s.try_clone()?),
            writer: s,
        })
    }

    /// Bounds how long one call waits for the daemon's answer (60 s by
    /// default); health probes use a short one.
    pub fn set_timeout(&self, limit: Duration) -> Result<(), ClientError> {
        self.writer.set_read_timeout(Some(limit))?;
        self.writer.set_write_timeout(Some(limit))?;
        Ok(())
    }

    /// Sends a request and returns the `result` value.
    pub fn call(&mut self, req: &Request) -> Result<serde_json::Value, ClientError> {
        let mut line =
            serde_json::to_vec(req).map_err(|e| ClientError::BadAnswer(e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        let mut answer = String::new();
        if self.reader.read_line(&mut answer)? == 0 {
            return Err(ClientError::BadAnswer("connection closed".into()));
        }
        let r: Response =
            serde_json::from_str(&answer).map_err(|e| ClientError::BadAnswer(e.to_string()))?;
        if r.ok {
            Ok(r.result.unwrap_or(serde_json::Value::Null))
        } else {
            Err(ClientError::Api(r.error.unwrap_or_else(|| {
                ApiError::new(ErrorCode::Internal, "error without details")
            })))
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
        Ok((v, &mut self.reader))
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
