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

/// The state format this build writes and the newest it reads. Any change
/// to what the file holds (a field added, a meaning changed) takes the
/// next number, [`StateStore::load`] learns to read the older ones, and
/// `dataplane/tests/fixtures/state/` gains a file of the new format.
pub const STATE_VERSION: u32 = 1;

/// Why the state file was not read.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// Reading it failed.
    #[error("{path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
    /// It is not a state document of its version.
    #[error("{path}: {why}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A newer release wrote it: this build cannot know what it holds.
    #[error("{path} has state format {found}, newer than this build's {STATE_VERSION}: a newer release of switchyard wrote it; run that release, or move the file away to start without its bridges and ports")]
    Newer {
        /// The file.
        path: PathBuf,
        /// Its format.
        found: u64,
    },
}

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
    /// The slice of each overlay's addresses the node agent claimed for
    /// this node (`overlay_slice`), with the split it is a slice of.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub overlay_slices: std::collections::BTreeMap<String, switchyard_api::overlay::SavedSlice>,
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

    /// Loads the state; a missing file is an empty state. The format's
    /// version is read first: a newer one is refused whole (nothing of it
    /// is guessed at), an older one would be brought up to date here.
    pub fn load(&self) -> Result<State, StateError> {
        let path = self.path();
        let corrupt = |why: String| StateError::Corrupt {
            path: path.clone(),
            why,
        };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(State {
                    version: STATE_VERSION,
                    ..State::default()
                })
            }
            Err(cause) => return Err(StateError::Io { path, cause }),
        };
        let doc: serde_json::Value =
            serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        // Files of the first format may lack the field (it was defaulted).
        let found = match doc.get("version") {
            None => 1,
            Some(v) => v
                .as_u64()
                .ok_or_else(|| corrupt(format!("version: {v} is not a format number")))?,
        };
        if found > u64::from(STATE_VERSION) {
            return Err(StateError::Newer { path, found });
        }
        // Format 1 is the only one so far: nothing to bring up to date.
        let mut state: State = serde_json::from_value(doc).map_err(|e| corrupt(e.to_string()))?;
        state.version = STATE_VERSION;
        Ok(state)
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
            overlay_slices: [(
                "ov".to_string(),
                switchyard_api::overlay::SavedSlice {
                    slice: 5,
                    split: serde_json::from_str(r#"{"subnet":"10.66.0.0/16"}"#).unwrap(),
                },
            )]
            .into(),
        };
        s.save(&st).unwrap();
        assert_eq!(s.load().unwrap(), st);
        // A leftover temp file from a crash does not disturb the real state.
        std::fs::write(d.path().join("sub").join(".state.json.tmp"), b"{garbage").unwrap();
        assert_eq!(s.load().unwrap(), st);

        // A damaged state file is an error, and can be set aside intact.
        std::fs::write(s.path(), b"{\"ports\": [").unwrap();
        let e = s.load().unwrap_err();
        assert!(matches!(e, StateError::Corrupt { .. }), "{e}");
        let aside = s.set_aside().unwrap();
        assert_eq!(std::fs::read(&aside).unwrap(), b"{\"ports\": [");
        assert_eq!(s.load().unwrap().ports.len(), 0);
    }

    #[test]
    fn the_format_version_is_read_first() {
        let d = tempfile::tempdir().unwrap();
        let s = StateStore::new(d.path());
        // A newer format is refused whole, even one this build could
        // parse: what it means may have changed.
        std::fs::write(s.path(), br#"{"version": 2, "bridges": [{"name": "b"}]}"#).unwrap();
        let e = s.load().unwrap_err();
        assert!(matches!(e, StateError::Newer { found: 2, .. }), "{e}");
        assert!(e.to_string().contains("newer than this build's 1"), "{e}");
        // The first format may lack the field.
        std::fs::write(s.path(), br#"{"bridges": [{"name": "b"}]}"#).unwrap();
        assert_eq!(s.load().unwrap().bridges[0].name, "b");
        std::fs::write(s.path(), br#"{"version": "one"}"#).unwrap();
        assert!(matches!(s.load(), Err(StateError::Corrupt { .. })));
    }
}
