//! The module layers in `src/lib.rs`'s doc are true of the imports: every
//! `crate::` path in a module's (non-test) code names a module of a lower
//! layer, so the import graph has no cycle; inside `port/`, `crate::` and
//! `super::` paths alike, the modules of each directory import each other
//! without a circle; and no module names a port kind but the kind itself
//! and `port/registry.rs` (no kind imports another, and `port/`'s shared
//! modules name none). `kind_edits` holds `docs/architecture.md` to its
//! count of what a new kind touches.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// `name -> layer` from the numbered list in lib.rs's doc.
fn layers() -> BTreeMap<String, usize> {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let mut out = BTreeMap::new();
    let mut layer = None;
    for line in lib.lines().take_while(|l| l.starts_with("//!")) {
        let text = line.trim_start_matches("//!").trim();
        if let Some((n, _)) = text.split_once(". ") {
            layer = n.parse::<usize>().ok().or(layer);
        }
        let Some(l) = layer else { continue };
        for part in text.split("[`").skip(1) {
            let name = part.split('`').next().unwrap();
            if !name.contains("::") {
                out.entry(name.to_string()).or_insert(l);
            }
        }
    }
    out
}

/// The modules `main.rs` declares: the binary's, not the library's.
fn binary_modules() -> Vec<String> {
    std::fs::read_to_string(src().join("main.rs"))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

/// Every `.rs` file below `dir`, with its top-level module and its path
/// relative to `src`.
fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without its test module and comments.
fn code(p: &Path) -> String {
    let text = std::fs::read_to_string(p).unwrap();
    let text = text.split("#[cfg(test)]").next().unwrap();
    text.lines()
        .map(|l| l.split("//").next().unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules a piece of code names as `crate::a::b` (first and second
/// segment).
fn uses(code: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for part in code.split("crate::").skip(1) {
        let mut segs = part
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
            .next()
            .unwrap()
            .split("::");
        let first = segs.next().unwrap_or_default().to_string();
        let second = segs.next().filter(|s| !s.is_empty()).map(str::to_string);
        out.push((first, second));
    }
    out
}

#[test]
fn every_import_goes_down_a_layer() {
    let layers = layers();
    assert!(layers.len() >= 10, "lib.rs lists the layers: {layers:?}");
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut wrong = Vec::new();
    for p in &all {
        let rel = p.strip_prefix(src()).unwrap();
        let top = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_str()
            .unwrap()
            .trim_end_matches(".rs")
            .to_string();
        // The binary's own modules (`mod cli;` in main.rs) sit above the
        // library: `crate::` there is the binary.
        if top == "lib" || top == "main" || binary_modules().contains(&top) {
            continue;
        }
        let own = *layers
            .get(&top)
            .unwrap_or_else(|| panic!("module {top} is missing from lib.rs's layer list"));
        for (used, _) in uses(&code(p)) {
            if used == top {
                continue;
            }
            match layers.get(&used) {
                Some(&l) if l < own => {}
                Some(&l) => wrong.push(format!(
                    "{} (layer {own}) imports crate::{used} (layer {l})",
                    rel.display()
                )),
                None => wrong.push(format!("{} imports unknown crate::{used}", rel.display())),
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

/// The module path of a file below `src` (`port/socket/listener.rs` ->
/// `port::socket::listener`; a `mod.rs` is its directory's module).
fn module_of(rel: &Path) -> Vec<String> {
    let mut segs: Vec<String> = rel
        .components()
        .map(|c| {
            c.as_os_str()
                .to_str()
                .unwrap()
                .trim_end_matches(".rs")
                .to_string()
        })
        .collect();
    if segs.last().is_some_and(|l| l == "mod") {
        segs.pop();
    }
    segs
}

/// The modules a piece of code in module `me` names through `crate::` and
/// `super::` paths, as absolute paths (`use super::{a, b::c}` included).
fn paths_named(me: &[String], code: &str) -> Vec<Vec<String>> {
    fn ident(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '_'
    }
    /// The paths of a `use` tree after `base`: `x::y`, `{x, y::{z}}`.
    fn tree(base: &[String], rest: &str, out: &mut Vec<Vec<String>>) {
        let rest = rest.trim_start();
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut start = 0;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' | ',' if depth == 1 => {
                        tree(base, &group[start..i], out);
                        start = i + 1;
                        if c == '}' {
                            return;
                        }
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            return;
        }
        let mut path = base.to_vec();
        let mut r = rest;
        loop {
            let end = r.find(|c: char| !ident(c)).unwrap_or(r.len());
            if end == 0 {
                break;
            }
            path.push(r[..end].to_string());
            r = &r[end..];
            match r.strip_prefix("::") {
                Some(next) if next.starts_with('{') => return tree(&path, next, out),
                Some(next) => r = next,
                None => break,
            }
        }
        out.push(path);
    }
    let mut out = Vec::new();
    for (at, _) in code
        .match_indices("crate::")
        .chain(code.match_indices("super::"))
    {
        if at > 0 && ident(code[..at].chars().last().unwrap()) {
            continue; // `xsuper::` or the `super::` of `super::super::`
        }
        if at >= 2 && &code[at - 2..at] == "::" {
            continue; // a later `super::` of `super::super::`
        }
        let mut base: Vec<String> = Vec::new();
        let mut r = &code[at..];
        if let Some(rest) = r.strip_prefix("crate::") {
            r = rest;
        } else {
            base = me.to_vec();
            while let Some(rest) = r.strip_prefix("super::") {
                base.pop();
                r = rest;
            }
        }
        tree(&base, r, &mut out);
    }
    out
}

/// A circle in `edges` (`from -> to`), if there is one.
fn circle(edges: &BTreeMap<String, std::collections::BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, std::collections::BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut std::collections::BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == n) {
            let mut c = path[i..].to_vec();
            c.push(n.to_string());
            return Some(c);
        }
        if done.contains(n) {
            return None;
        }
        path.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(n.to_string());
        None
    }
    let mut done = Default::default();
    edges
        .keys()
        .find_map(|n| visit(n, edges, &mut Vec::new(), &mut done))
}

/// Inside `port/`, in every directory, the modules beside each other (a
/// file, or a subdirectory taken whole) import each other without a
/// circle, through `crate::` and `super::` paths alike. A directory's
/// `mod.rs` is its children's parent: they use its items, it declares them,
/// and neither counts as an edge.
#[test]
fn the_port_modules_import_each_other_without_a_circle() {
    let mut all = Vec::new();
    files(&src().join("port"), &mut all);
    // directory -> (child -> children it names)
    let mut graphs: BTreeMap<Vec<String>, BTreeMap<String, std::collections::BTreeSet<String>>> =
        BTreeMap::new();
    for p in &all {
        let rel = p.strip_prefix(src()).unwrap();
        let me = module_of(rel);
        let is_mod = rel.file_name().is_some_and(|f| f == "mod.rs");
        for named in paths_named(&me, &code(p)) {
            // Each directory both are in: the children of it they are in.
            for depth in 1..me.len() {
                let dir = &me[..depth];
                if named.len() <= depth || named[..depth] != *dir {
                    break;
                }
                let (from, to) = (&me[depth], &named[depth]);
                // A directory's own mod.rs is no child of it.
                let own_mod = is_mod && me.len() == depth + 1;
                if from != to && !own_mod {
                    graphs
                        .entry(dir.to_vec())
                        .or_default()
                        .entry(from.clone())
                        .or_default()
                        .insert(to.clone());
                }
            }
        }
    }
    assert!(
        graphs
            .get(&vec!["port".to_string()])
            .is_some_and(|g| g.get("registry").is_some_and(|r| r.contains("memif"))),
        "the check sees the registry's imports: {graphs:?}"
    );
    let circles: Vec<String> = graphs
        .iter()
        .filter_map(|(dir, g)| circle(g).map(|c| format!("{}: {}", dir.join("::"), c.join(" -> "))))
        .collect();
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_circle_check_sees_super_paths_and_circles() {
    let me: Vec<String> = ["port", "socket", "listener"].map(String::from).to_vec();
    let named = paths_named(
        &me,
        "use super::protocol::{Greeting, Sub};\nuse super::super::{takeover::FdRef, PortCtx};\nlet x = crate::reactor::Token::Socket;",
    );
    let names: Vec<String> = named.iter().map(|p| p.join("::")).collect();
    assert!(
        names.contains(&"port::socket::protocol::Greeting".to_string()),
        "{names:?}"
    );
    assert!(
        names.contains(&"port::takeover::FdRef".to_string()),
        "{names:?}"
    );
    assert!(names.contains(&"port::PortCtx".to_string()), "{names:?}");
    assert!(
        names.contains(&"reactor::Token::Socket".to_string()),
        "{names:?}"
    );
    let mut g: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
    g.entry("listener".into())
        .or_default()
        .insert("port".into());
    g.entry("port".into())
        .or_default()
        .insert("protocol".into());
    assert!(circle(&g).is_none());
    g.entry("protocol".into())
        .or_default()
        .insert("listener".into());
    assert!(circle(&g).is_some());
}

/// The port kinds: the modules `port/registry.rs` takes from `super`.
fn port_kinds() -> Vec<String> {
    let reg = code(&src().join("port/registry.rs"));
    let list = reg
        .split("use super::{")
        .nth(1)
        .expect("registry.rs imports the kinds from super")
        .split('}')
        .next()
        .unwrap();
    list.split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .map(str::to_string)
        .collect()
}

#[test]
fn only_the_registry_names_a_port_kind() {
    // A kind's own files are port/<kind>.rs and port/<kind>/.
    let kinds = port_kinds();
    assert!(kinds.len() >= 5, "{kinds:?}");
    let mut all = Vec::new();
    files(&src(), &mut all);
    let mut wrong = Vec::new();
    for p in &all {
        let rel = p.strip_prefix(src()).unwrap();
        let in_port = rel.starts_with("port");
        // The kind this file belongs to, if any: port/<kind>.rs or port/<kind>/.
        let own = rel
            .components()
            .nth(1)
            .filter(|_| in_port)
            .map(|c| c.as_os_str().to_str().unwrap().trim_end_matches(".rs"));
        if rel == Path::new("port/registry.rs") {
            continue;
        }
        let code = code(p);
        for k in &kinds {
            if own == Some(k.as_str()) {
                continue;
            }
            let named = uses(&code)
                .iter()
                .any(|(first, second)| first == "port" && second.as_deref() == Some(k))
                || (in_port && code.contains(&format!("super::{k}")))
                // The parent module reaches its children by name.
                || (rel == Path::new("port/mod.rs") && code.contains(&format!("{k}::")));
            if named {
                wrong.push(format!("{} names port kind {k}", rel.display()));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// What adding a port kind touches outside the kind's own modules, as
/// `docs/architecture.md` ("Adding a port kind") counts it: the lines of
/// each source file that name memif (a socket kind) or af-xdp (an uplink
/// kind), outside their own modules and tests. The document's tables must
/// be the counts; the CLI, the device plugin, the webhook and the daemon
/// above `port/` must name no kind at all.
mod kind_edits {
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
            i == 0
                || !code.as_bytes()[i - 1].is_ascii_alphanumeric() && code.as_bytes()[i - 1] != b'_'
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
        "dataplane/src/dataplane/",
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

    /// `file -> lines` naming `kind` outside its own modules, in code (not
    /// comments, not test modules).
    fn count(kind: &Kind) -> BTreeMap<String, usize> {
        let root = workspace();
        let mut files = Vec::new();
        for r in ROOTS {
            super::files(&root.join(r), &mut files);
        }
        let mut out = BTreeMap::new();
        for p in files {
            let rel = p.strip_prefix(&root).unwrap().to_str().unwrap().to_string();
            if kind.own.iter().any(|o| rel.starts_with(o)) {
                continue;
            }
            let n = super::code(&p).lines().filter(|l| (kind.names)(l)).count();
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
}
