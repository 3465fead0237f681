//! A port taken over by another switch process (`switchyard run
//! --takeover`): what a port writes down about its connection, and the file
//! descriptors that go with it.
//!
//! A takeover of one port, in the order the two processes run it:
//!
//! 0. A port that is [`super::Port::quiet`] (no connection) goes before
//!    the pause: old [`super::Port::save`], new [`super::Port::restore`],
//!    while the old workers forward; nothing of it changes until the old
//!    switch's daemon thread, busy in the conversation, is back. Then:
//! 1. old: [`super::Port::pause`], its workers paused at a burst boundary:
//!    a kind whose queues' state lives in the switch (vhost-user's device)
//!    takes its queues back; a half-done handshake is dropped.
//! 2. old: [`super::Port::save`], which changes nothing: the kind's typed
//!    state (its `persist.rs`), every fd into an [`FdOut`], named by its
//!    [`FdRef`] there.
//! 3. new: [`super::Port::restore`] instead of `start`, the fds as an
//!    [`FdIn`] in the same order: sockets, connection, queues where the
//!    rings are.
//! 4. old, only if the takeover failed: [`super::Port::resume`] undoes the
//!    pause, the queues going on from where the rings are.
//!
//! Each kind keeps its saved types and its save and restore in
//! `port/<kind>/persist.rs`; the socket kinds' and uplink kinds' state is
//! nested in their framework's ([`super::socket`], [`super::kernel`]).
//! JSON appears only here, at the `Box<dyn Port>` boundary ([`Saved`]).
//! The fds are duplicates (`SCM_RIGHTS`): the old process keeps its own
//! until it exits, so a takeover that fails leaves it where it was.
//!
//! The format is [`VERSION`]: a change of any saved type is a new version,
//! and each kind's golden file (`port/<kind>/takeover.v<N>.json`, checked
//! by its `persist.rs` tests) fails until it is made.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// The version of the state this build writes and reads: the takeover
/// conversation's, and every kind's saved types. A takeover between builds
/// of different versions is refused (the new one then starts as after a
/// restart, once the old one has stopped). Changes to any type a kind
/// saves require a new version, and a golden file for it.
pub const VERSION: u32 = 1;

/// A saved port's state, as the daemon carries it: a kind's own serde
/// form, read back only by the same kind (each kind refuses fields it does
/// not know).
pub type Saved = serde_json::Value;

/// Where an fd is in a takeover's list: what saved state holds in place of
/// the fd (written as the bare index).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct FdRef(pub usize);

/// Why saved state cannot be taken up.
#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    /// An fd the state names is not in the list, or was taken twice.
    #[error("the saved state names fd {}, which did not come with it", .0 .0)]
    MissingFd(FdRef),
    /// The state does not read as this kind's.
    #[error("saved state: {0}")]
    Format(#[from] serde_json::Error),
    /// The state reads, but does not hold together (e.g. a ring outside
    /// its region).
    #[error("saved state: {0}")]
    Invalid(String),
    /// A system call failed (mapping memory, watching a socket).
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// The fds being handed over, as their owners keep them.
#[derive(Debug, Default)]
pub struct FdOut {
    fds: Vec<RawFd>,
}

impl FdOut {
    /// Adds `fd`; returns where it is in the list. The fd must stay open
    /// until the list is sent: the daemon sends it while it holds every
    /// port, so nothing closes one meanwhile.
    pub fn add(&mut self, fd: BorrowedFd<'_>) -> FdRef {
        self.fds.push(fd.as_raw_fd());
        FdRef(self.fds.len() - 1)
    }

    /// The fds, in order.
    pub fn fds(&self) -> &[RawFd] {
        &self.fds
    }
}

/// The fds handed over, taken by their [`FdRef`].
#[derive(Debug, Default)]
pub struct FdIn {
    fds: Vec<Option<OwnedFd>>,
}

impl FdIn {
    /// The list as it arrived.
    pub fn new(fds: Vec<OwnedFd>) -> FdIn {
        FdIn {
            fds: fds.into_iter().map(Some).collect(),
        }
    }

    /// Takes fd `r`: each once.
    pub fn take(&mut self, r: FdRef) -> Result<OwnedFd, TakeoverError> {
        self.fds
            .get_mut(r.0)
            .and_then(Option::take)
            .ok_or(TakeoverError::MissingFd(r))
    }

    /// How many were not taken (closed when the list is dropped).
    pub fn left(&self) -> usize {
        self.fds.iter().flatten().count()
    }
}

/// Reads `saved` as a kind's state `T`.
pub fn read<T: serde::de::DeserializeOwned>(saved: Saved) -> Result<T, TakeoverError> {
    Ok(serde_json::from_value(saved)?)
}

/// Writes a kind's state `t` as [`Saved`].
pub fn write<T: serde::Serialize>(t: &T) -> Saved {
    serde_json::to_value(t).expect("saved state is plain data")
}

/// Checks a kind's saved state against its golden file: `value` (a
/// sample of every saved type of the kind, as [`write`] writes it) must
/// read exactly as `golden`, the contents of `file`, which must be the
/// file of the version this build writes (`takeover.v<VERSION>.json`). For
/// the kinds' `persist.rs` tests.
#[cfg(test)]
pub(crate) fn check_golden(kind: &str, value: &Saved, file: &str, golden: &str) {
    assert_eq!(
        file,
        format!("takeover.v{VERSION}.json"),
        "{kind}: the golden file of takeover version {VERSION} is checked"
    );
    let golden: Saved = serde_json::from_str(golden).expect("the golden file is JSON");
    assert!(
        *value == golden,
        "{kind}'s saved state is not takeover version {VERSION}'s any more: a changed format is a \
         new version (port::takeover::VERSION) and a new golden file \
         port/{kind}/takeover.v<N>.json, so that two builds that differ never take each other's \
         ports over.\nnow:\n{}\ngolden ({file}):\n{}",
        serde_json::to_string_pretty(value).unwrap(),
        serde_json::to_string_pretty(&golden).unwrap(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn fds_go_by_their_ref_and_each_is_taken_once() {
        let a = std::fs::File::open("/dev/null").unwrap();
        let mut out = FdOut::default();
        assert_eq!(out.add(a.as_fd()), FdRef(0));
        assert_eq!(out.add(a.as_fd()), FdRef(1));
        assert_eq!(out.fds(), [a.as_raw_fd(), a.as_raw_fd()]);
        let dup = a.as_fd().try_clone_to_owned().unwrap();
        let mut fds = FdIn::new(vec![dup]);
        assert!(matches!(
            fds.take(FdRef(1)),
            Err(TakeoverError::MissingFd(FdRef(1)))
        ));
        assert!(fds.take(FdRef(0)).is_ok());
        assert!(fds.take(FdRef(0)).is_err());
        assert_eq!(fds.left(), 0);
        assert_eq!(serde_json::to_string(&FdRef(7)).unwrap(), "7");
    }
}
