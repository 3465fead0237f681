//! A port handed to another switch process (a takeover, `switchyard run
//! --takeover`): what a port writes down about its connection, and the file
//! descriptors that go with it.
//!
//! The process handing over calls [`super::Port::save`] on every port while
//! its workers are paused at a burst boundary; each fd goes into an
//! [`FdOut`] and is named in the saved state by its index there. The process
//! taking over gets the same list, in the same order, as an [`FdIn`], and
//! calls [`super::Port::restore`] instead of `start`. The fds are duplicates
//! (`SCM_RIGHTS`): the old process keeps its own until it exits, so a
//! takeover that fails leaves it where it was.

use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};

/// A saved port's state: a kind's own serde form, read back only by the same
/// kind (each kind refuses fields it does not know).
pub type Saved = serde_json::Value;

/// Why saved state cannot be taken up.
#[derive(Debug, thiserror::Error)]
pub enum HandoverError {
    /// An fd index the state names is not in the list, or was taken twice.
    #[error("the saved state names fd {0}, which did not come with it")]
    MissingFd(usize),
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
    /// Adds `fd`; returns its index in the list. The fd must stay open
    /// until the list is sent: the daemon sends it while it holds every
    /// port, so nothing closes one meanwhile.
    pub fn add(&mut self, fd: BorrowedFd<'_>) -> usize {
        self.fds.push(fd.as_raw_fd());
        self.fds.len() - 1
    }

    /// The fds, in order.
    pub fn fds(&self) -> &[RawFd] {
        &self.fds
    }
}

/// The fds handed over, taken by index.
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

    /// Takes fd `i`: each once.
    pub fn take(&mut self, i: usize) -> Result<OwnedFd, HandoverError> {
        self.fds
            .get_mut(i)
            .and_then(Option::take)
            .ok_or(HandoverError::MissingFd(i))
    }

    /// How many were not taken (closed when the list is dropped).
    pub fn left(&self) -> usize {
        self.fds.iter().flatten().count()
    }
}

/// Reads `saved` as `T`.
pub fn read<T: serde::de::DeserializeOwned>(saved: Saved) -> Result<T, HandoverError> {
    Ok(serde_json::from_value(saved)?)
}

/// Writes `t` as saved state.
pub fn write<T: serde::Serialize>(t: &T) -> Saved {
    serde_json::to_value(t).expect("saved state is plain data")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn fds_go_by_index_and_each_is_taken_once() {
        let a = std::fs::File::open("/dev/null").unwrap();
        let mut out = FdOut::default();
        assert_eq!(out.add(a.as_fd()), 0);
        assert_eq!(out.add(a.as_fd()), 1);
        assert_eq!(out.fds(), [a.as_raw_fd(), a.as_raw_fd()]);
        let dup = a.as_fd().try_clone_to_owned().unwrap();
        let mut fds = FdIn::new(vec![dup]);
        assert!(matches!(fds.take(1), Err(HandoverError::MissingFd(1))));
        assert!(fds.take(0).is_ok());
        assert!(matches!(fds.take(0), Err(HandoverError::MissingFd(0))));
        assert_eq!(fds.left(), 0);
    }
}
