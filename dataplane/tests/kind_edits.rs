//! What adding a port kind touches outside the kind's own modules, as
//! `docs/architecture.md` ("Adding a port kind") counts it: the lines of
//! each source file that name memif (a socket kind) or af-xdp (an uplink
//! kind), outside their own modules and tests. The document's tables must
//! be the counts; the CLI, the device plugin, the webhook and the daemon
//! above `port/` must name no kind at all.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A kind: how code names it, and its own modules (paths from the
/// workspace root; a path ending in `/` is a directory).
struct Kind {
    name: &'static str,
    names: fn(&str) -> bool,
    own: &'static [&'static str],
}

fn word_at(code: &str, word: &str) -> bool {
    code.match_indices(word).any(|(i, _)| {
        i == 0 || !code.as_bytes()[i - 1].is_ascii_alphanumeric() && code.as_bytes()[i - 1] != b'_'
    })
}

const KINDS: &[Kind] = &[
    Kind {
        name: "memif",
        names: |c| word_at(c, "Memif") || word_at(c, "memif::") || c.contains("\"memif\""),
        own: &[
            "api/src/spec/memif.rs",
            "dataplane/src/port/memif/",
            "dataplane/src/wire/memif.rs",
        ],
    },
    Kind {
        name: "af-xdp",
        names: |c| {
            word_at(c, "AfXdp")
                || word_at(c, "XdpMode")
                || word_at(c, "af_xdp::")
                || c.contains("\"af-xdp\"")
        },
        own: &["api/src/spec/af_xdp.rs", "dataplane/src/port/af_xdp/"],
    },
];

/// Where no kind may be named: a new kind needs no edit there.
const NEVER: &[&str] = &[
    "dataplane/src/main.rs",
    "dataplane/src/cli/",
    "dataplane/src/control/",
    "dataplane/src/forward.rs",
    "dataplane/src/worker.rs",
    "dataplane/src/dataplane.rs",
    "dataplane/src/port/mod.rs",
    "deviceplugin/src/",
    "webhook/src/",
];

const ROOTS: &[&str] = &[
    "api/src",
    "dataplane/src",
    "cni/src",
    "deviceplugin/src",
    "webhook/src",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `file -> lines` naming `kind` outside its own modules, in code (not
/// comments, not test modules).
fn count(kind: &Kind) -> BTreeMap<String, usize> {
    let root = workspace();
    let mut files = Vec::new();
    for r in ROOTS {
        rs_files(&root.join(r), &mut files);
    }
    let mut out = BTreeMap::new();
    for p in files {
        let rel = p.strip_prefix(&root).unwrap().to_str().unwrap().to_string();
        if kind.own.iter().any(|o| rel.starts_with(o)) {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let code = text.split("#[cfg(test)]").next().unwrap();
        let n = code
            .lines()
            .map(|l| l.split("//").next().unwrap())
            .filter(|l| (kind.names)(l))
            .count();
        if n > 0 {
            out.insert(rel, n);
        }
    }
    out
}

/// The table after `<!-- kind-edits NAME -->` in docs/architecture.md.
fn documented(name: &str) -> BTreeMap<String, usize> {
    let doc = std::fs::read_to_string(workspace().join("docs/architecture.md")).unwrap();
    let start = format!("<!-- kind-edits {name} -->");
    let mut out = BTreeMap::new();
    let Some(at) = doc.find(&start) else {
        return out;
    };
    for line in doc[at + start.len()..].lines().skip(1) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if let (Some(file), Some(Ok(n))) = (
            cells
                .get(1)
                .and_then(|f| f.strip_prefix('`')?.strip_suffix('`')),
            cells.get(2).map(|n| n.parse::<usize>()),
        ) {
            out.insert(file.to_string(), n);
        }
    }
    out
}

#[test]
fn the_documented_edit_counts_are_the_code() {
    let mut wrong = Vec::new();
    for kind in KINDS {
        let found = count(kind);
        if found != documented(kind.name) {
            let rows: Vec<String> = found
                .iter()
                .map(|(f, n)| format!("| `{f}` | {n} |"))
                .collect();
            wrong.push(format!(
                "<!-- kind-edits {} --> should read ({} lines in {} files):\n{}",
                kind.name,
                found.values().sum::<usize>(),
                found.len(),
                rows.join("\n")
            ));
        }
        for f in found.keys() {
            assert!(
                !NEVER.iter().any(|n| f.starts_with(n)),
                "{f} names {}: the CLI, the device plugin, the webhook and the daemon above port/ name no kind",
                kind.name
            );
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
}

#[test]
fn the_count_sees_what_it_counts() {
    let memif = &KINDS[0];
    assert!((memif.names)("KindSpec::Memif(m) => memif::port(name, m),"));
    assert!((memif.names)(r#"k == "memif""#));
    assert!(!(memif.names)("let is_memif = 1; NoMemif"));
    // The registry names every kind, once.
    for kind in KINDS {
        assert_eq!(count(kind).get("dataplane/src/port/registry.rs"), Some(&1));
    }
}
