//! A socket port's takeover: its end of the socket, its connection as its
//! kind saves it, its status. See [`crate::port::takeover`] for the steps.

use switchyard_api::PortStatus;

use super::port::{End, SocketPort};
use super::protocol::{Closed, Protocol};
use crate::port::takeover::{FdIn, FdOut, FdRef, TakeoverError};
use crate::port::{Persist, PortCtx, PortError};

/// A socket port as saved for a takeover.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedSocketPort<C> {
    /// The listening socket, if the switch listens. Every port of a shared
    /// socket hands it over; the new switch listens on the first, and
    /// closes the other duplicates.
    listener: Option<FdRef>,
    /// The connection, as the kind saved it.
    conn: Option<C>,
    status: PortStatus,
}

#[cfg(test)]
impl<C> SavedSocketPort<C> {
    /// A saved port, its status the default: for the kinds' golden files.
    pub(crate) fn sample(listener: Option<FdRef>, conn: Option<C>) -> SavedSocketPort<C> {
        SavedSocketPort {
            listener,
            conn,
            status: PortStatus::default(),
        }
    }
}

impl<P: Protocol> SocketPort<P> {
    /// Takeover, first step: a handshake half done is dropped (nothing of
    /// it has reached the workers: the peer starts it again, as after any
    /// failed one); the kind pauses a settled connection.
    pub(super) fn pause_conn(&mut self, cx: &PortCtx<'_>) {
        if self.conn.as_ref().is_some_and(|c| !P::settled(c)) {
            self.disconnect(
                cx,
                Closed {
                    say: true,
                    ..Closed::gone("the switch is being upgraded: handshake restarted")
                },
            );
        }
        if let Some(conn) = self.conn.as_mut() {
            self.proto.pause(cx, conn);
        }
    }

    /// A failed takeover: the kind undoes its pause.
    pub(super) fn resume_conn(&mut self, cx: &PortCtx<'_>) {
        if let Some(conn) = self.conn.as_mut() {
            if let Err(why) = self.proto.resume(cx, conn) {
                self.disconnect(cx, why);
            }
        }
    }
}

impl<P: Protocol> Persist for SocketPort<P> {
    type Saved = SavedSocketPort<P::Saved>;

    fn save_state(&self, _cx: &PortCtx<'_>, fds: &mut FdOut) -> Result<Self::Saved, PortError> {
        let conn = match &self.conn {
            Some(c) if P::settled(c) => Some(self.proto.save(c, fds).map_err(PortError::Other)?),
            Some(_) => {
                return Err(PortError::Other(
                    "a handshake under way (the port was not paused)".into(),
                ))
            }
            None => None,
        };
        Ok(SavedSocketPort {
            listener: self.listener().and_then(|l| l.save(fds)),
            conn,
            status: self.status.clone(),
        })
    }

    fn restore_state(
        &mut self,
        cx: &PortCtx<'_>,
        saved: Self::Saved,
        fds: &mut FdIn,
    ) -> Result<(), PortError> {
        let listens = matches!(self.end, End::Listens { .. });
        if saved.listener.is_some() != listens {
            return Err(TakeoverError::Invalid(format!(
                "the saved port {} listen, this one does{}",
                if saved.listener.is_some() {
                    "does"
                } else {
                    "does not"
                },
                if listens { "" } else { " not" }
            ))
            .into());
        }
        self.status = saved.status;
        if let Some(i) = saved.listener {
            self.join(cx, Some(fds.take(i)?))?;
        }
        let restored = match saved.conn {
            Some(c) => self
                .proto
                .restore(cx, c, fds, &mut self.status)
                .and_then(|conn| self.watch(cx, conn).map_err(TakeoverError::Io)),
            None => {
                self.status.link_up = false;
                self.try_connect(cx);
                Ok(())
            }
        };
        if restored.is_err() {
            // The port is dropped, not stopped: it leaves the socket now,
            // whose file is still the old switch's (it carries on).
            self.leave_handed(cx);
        }
        Ok(restored?)
    }
}
