//! Port churn, as an operator's or a CNI's calls make it: four names in
//! turn, each added (a memif master on a socket in a directory of the
//! test's) and deleted again. The API tests across takeovers and restarts
//! (`dataplane/tests/takeover.rs`, `cni/tests/cluster.rs`) run it and
//! compare what it holds with the switch's ports.

use std::collections::HashSet;
use std::path::PathBuf;

use switchyard_api::{KindSpec, MemifRole, MemifSpec, PortSpec, Request, SocketAddr};

/// Ports added and deleted in turn.
pub struct PortChurn {
    prefix: String,
    dir: PathBuf,
    bridge: String,
    held: HashSet<String>,
    turn: u32,
}

impl PortChurn {
    /// Ports `<prefix>0` to `<prefix>3` on `bridge`, their sockets in `dir`.
    pub fn new(prefix: &str, dir: PathBuf, bridge: &str) -> PortChurn {
        PortChurn {
            prefix: prefix.to_string(),
            dir,
            bridge: bridge.to_string(),
            held: HashSet::new(),
            turn: 0,
        }
    }

    /// The next call, and the port it is about: a delete of a port the
    /// churn holds, else an add.
    pub fn next(&mut self) -> (String, Request) {
        let name = format!("{}{}", self.prefix, self.turn % 4);
        self.turn += 1;
        let req = if self.held.contains(&name) {
            Request::PortDel { name: name.clone() }
        } else {
            let mut spec = PortSpec::new(
                &name,
                KindSpec::Memif(MemifSpec::new(
                    MemifRole::Master,
                    SocketAddr::Path(self.dir.join(format!("{name}.sock"))),
                )),
            );
            spec.bridge = Some(self.bridge.clone());
            Request::PortAdd {
                port: Box::new(spec),
            }
        };
        (name, req)
    }

    /// The call about `name` succeeded.
    pub fn done(&mut self, name: String) {
        if !self.held.remove(&name) {
            self.held.insert(name);
        }
    }

    /// The ports the churn holds.
    pub fn held(self) -> HashSet<String> {
        self.held
    }
}
