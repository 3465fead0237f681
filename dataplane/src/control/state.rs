//! Persisted state: the bridges and ports created through the API, so a
//! restarted daemon recreates them. Written atomically (temp file, fsync,
//! rename, fsync of the directory): a crash leaves the old or the new state,
//! never a torn one.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use switchyard_api::fs::write_atomic;

use crate::config::{BridgeSpec, PortSpec};

/// File name inside the state directory.
pub const STATE_FILE: &str = "state.json";

/// The persisted document.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// Format version.
    #[serde(default = "one")]
    pub version: u32,
    /// Bridges added at run time.
    #[serde(default)]
    pub bridges: Vec<BridgeSpec>,
    /// Ports added at run time.
    #[serde(default)]
    pub ports: Vec<PortSpec>,
}

fn one() -> u32 {
    1
}

/// Reads and writes the state file of one directory.
pub struct StateStore {
    dir: PathBuf,
}

impl StateStore {
    /// A store in `dir` (created on first save).
    pub fn new(dir: &Path) -> StateStore {
        StateStore {
            dir: dir.to_path_buf(),
        }
    }

    /// The state file's path.
    pub fn path(&self) -> PathBuf {
        self.dir.join(STATE_FILE)
    }

    /// Loads the state; a missing file is an empty state.
    pub fn load(&self) -> std::io::Result<State> {
        match std::fs::read(self.path()) {
            Ok(b) => serde_json::from_slice(&b).map_err(|e| {
                std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}: {e}", self.path().display()),
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State {
                version: 1,
                ..State::default()
            }),
            Err(e) => Err(e),
        }
    }

    /// Moves an unreadable state file aside (`state.json.corrupt-<secs>`)
    /// so that the next save cannot overwrite what an operator may still
    /// want to recover. Returns the new name.
    pub fn set_aside(&self) -> std::io::Result<PathBuf> {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let to = self.dir.join(format!("{STATE_FILE}.corrupt-{secs}"));
        std::fs::rename(self.path(), &to)?;
        Ok(to)
    }

    /// Replaces the state atomically.
    pub fn save(&self, state: &State) -> std::io::Result<()> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let body = serde_json::to_vec_pretty(state).map_err(std::io::Error::other)?;
        write_atomic(&self.path(), &body, 0o600)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saves_and_loads_atomically() {
        let d = tempfile::tempdir().unwrap();
        let s = StateStore::new(&d.path().join("sub"));
        assert_eq!(s.load().unwrap().ports.len(), 0);
        let st = State {
            version: 1,
            bridges: vec![BridgeSpec { name: "b".into() }],
            ports: vec![serde_json::from_str(
                r#"{"name":"p","kind":"memif","role":"master","socket":"/tmp/x.sock","id":3,
                    "bridge":"b","trunk":"10,20-30","socket_group":1234,"mac_limit":8,
                    "macs":["02:00:00:00:00:01"]}"#,
            )
            .unwrap()],
        };
        s.save(&st).unwrap();
        assert_eq!(s.load().unwrap(), st);
        // A leftover temp file from a crash does not disturb the real state.
        std::fs::write(d.path().join("sub").join(".state.json.tmp"), b"{garbage").unwrap();
        assert_eq!(s.load().unwrap(), st);

        // A damaged state file is an error, and can be set aside intact.
        std::fs::write(s.path(), b"{\"ports\": [").unwrap();
        let e = s.load().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
        let aside = s.set_aside().unwrap();
        assert_eq!(std::fs::read(&aside).unwrap(), b"{\"ports\": [");
        assert_eq!(s.load().unwrap().ports.len(), 0);
    }
}
