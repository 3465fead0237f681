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
            .is_some_and(|g| g.get("memif").is_some_and(|r| r.contains("socket"))),
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

/// The port kinds: the modules the `registry::port_kinds!` list in
/// `port/mod.rs` declares.
fn port_kinds() -> Vec<String> {
    registry_block()
        .lines()
        .filter_map(|l| l.split("=>").nth(1))
        .map(|m| m.trim().trim_end_matches(',').to_string())
        .filter(|n| !n.is_empty())
        .collect()
}

/// The `registry::port_kinds! { ... }` block of `port/mod.rs`: the one
/// list of the kinds.
fn registry_block() -> String {
    let code = code(&src().join("port/mod.rs"));
    let start = code
        .find("registry::port_kinds! {")
        .expect("port/mod.rs lists the kinds with registry::port_kinds!");
    let end = start + code[start..].find('}').unwrap();
    code[start..=end].to_string()
}

#[test]
fn only_the_registry_names_a_port_kind() {
    // A kind's own files are port/<kind>.rs and port/<kind>/; the list is
    // port/mod.rs's registry block.
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
        let code = if rel == Path::new("port/mod.rs") {
            code(p).replace(&registry_block(), "")
        } else {
            code(p)
        };
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

/// Where no port kind may be named (a new kind needs no edit there): the
/// CLI, the device plugin, the webhook and the daemon above `port/`. Names
/// are read as the code spells memif (a socket kind) and af-xdp (an
/// uplink kind).
mod kind_names {
    use std::path::{Path, PathBuf};

    fn word_at(code: &str, word: &str) -> bool {
        code.match_indices(word).any(|(i, _)| {
            i == 0
                || !code.as_bytes()[i - 1].is_ascii_alphanumeric() && code.as_bytes()[i - 1] != b'_'
        })
    }

    /// Whether a line of code names memif or af-xdp.
    fn names_a_kind(c: &str) -> bool {
        word_at(c, "Memif")
            || word_at(c, "memif::")
            || c.contains("\"memif\"")
            || word_at(c, "AfXdp")
            || word_at(c, "XdpMode")
            || word_at(c, "af_xdp::")
            || c.contains("\"af-xdp\"")
    }

    const NEVER: &[&str] = &[
        "dataplane/src/main.rs",
        "dataplane/src/cli/",
        "dataplane/src/control/",
        "dataplane/src/forward.rs",
        "dataplane/src/worker.rs",
        "dataplane/src/dataplane/",
        "dataplane/src/port/mod.rs",
        "dataplane/src/port/socket/",
        "dataplane/src/port/kernel/",
        "dataplane/src/port/takeover.rs",
        "deviceplugin/src/",
        "webhook/src/",
    ];

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf()
    }

    #[test]
    fn no_kind_is_named_where_a_new_kind_needs_no_edit() {
        let root = workspace();
        let mut wrong = Vec::new();
        for n in NEVER {
            let at = root.join(n);
            let mut files = Vec::new();
            if at.is_dir() {
                super::files(&at, &mut files);
            } else {
                files.push(at.clone());
            }
            assert!(!files.is_empty() && files[0].exists(), "{n} is not there");
            for f in files {
                let mut code = super::code(&f);
                if f.ends_with("dataplane/src/port/mod.rs") {
                    code = code.replace(&super::registry_block(), "");
                }
                if let Some(l) = code.lines().find(|l| names_a_kind(l)) {
                    wrong.push(format!("{}: {}", f.display(), l.trim()));
                }
            }
        }
        assert!(
            wrong.is_empty(),
            "a kind named where none may be:\n{}",
            wrong.join("\n")
        );
        assert!(names_a_kind("KindSpec::Memif(m) => memif::port(name, m),"));
        assert!(!names_a_kind("let is_memif = 1; NoMemif"));
    }
}

/// What adding a port kind takes, measured: a copy of the workspace gets a
/// scratch socket kind and a scratch uplink kind (their own modules, and
/// the lines below in the files that list the kinds), and must build
/// (`cargo check` of the API, the daemon and the CNI). The lines each
/// file needs must be `docs/architecture.md`'s tables ("Adding a port
/// kind"). A line fewer in any file the compiler lists (exhaustive
/// matches): the copy does not build.
mod kind_edits {
    use std::collections::BTreeMap;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    /// A line added or changed in a file that lists the kinds: `anchor`,
    /// found once, becomes `with` (a changed line is one line, as written
    /// before `cargo fmt` wraps it).
    struct Edit {
        file: &'static str,
        anchor: &'static str,
        with: &'static str,
    }

    /// A scratch kind: its name in the doc's table, its own modules (path,
    /// contents; an API spec copied from an existing kind's, renamed), and
    /// the edits.
    struct Scratch {
        name: &'static str,
        api_spec: (&'static str, &'static [(&'static str, &'static str)]),
        own: &'static [(&'static str, &'static str)],
        edits: &'static [Edit],
    }

    const SOCKET_PORT: &str = r#"//! A scratch socket kind (tests/layers.rs builds it).
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use nix::sys::socket::SockType;
use switchyard_api::spec::scratch::ScratchSpec;
use switchyard_api::{PortStatus, Side};

use crate::port::registry::Build;
use crate::port::socket::{Closed, Greeting, Protocol, SocketPort};
use crate::port::takeover::{FdIn, FdOut, FdRef, TakeoverError};
use crate::port::{Port, PortCtx};

/// A scratch port.
pub fn port(spec: &ScratchSpec, b: &Build<'_>) -> Box<dyn Port> {
    Box::new(SocketPort::new(b.name(), spec.socket_spec(), Scratch, b.listeners))
}

struct Scratch;

impl Greeting for Scratch {
    type Intro = ();
    type Offer = ();
    const KIND: &'static str = "scratch";
    const SOCK_TYPE: SockType = SockType::Stream;
    fn introduce(_: BorrowedFd<'_>) -> Result<Option<(u32, ())>, Closed> {
        Ok(Some((0, ())))
    }
}

impl Protocol for Scratch {
    type Conn = OwnedFd;
    type Saved = FdRef;
    fn offer(&self) {}
    fn open(&mut self, _: &PortCtx<'_>, fd: OwnedFd, _: Side) -> Result<OwnedFd, String> {
        Ok(fd)
    }
    fn on_intro(&mut self, _: &PortCtx<'_>, _: &mut OwnedFd, _: (), _: &mut PortStatus) -> Result<(), Closed> {
        Ok(())
    }
    fn fd(conn: &OwnedFd) -> BorrowedFd<'_> {
        conn.as_fd()
    }
    fn on_ready(&mut self, _: &PortCtx<'_>, _: &mut OwnedFd, _: &mut PortStatus) -> Result<(), Closed> {
        Err(Closed::gone("the peer said something"))
    }
    fn deadline(&self, _: &OwnedFd) -> Option<Instant> {
        None
    }
    fn on_timer(&mut self, _: &mut OwnedFd, _: Instant) -> Result<(), Closed> {
        Ok(())
    }
    fn close(&mut self, _: &PortCtx<'_>, _: OwnedFd, _: &str, _: bool) -> bool {
        false
    }
    fn save(&self, conn: &OwnedFd, fds: &mut FdOut) -> Result<FdRef, String> {
        Ok(fds.add(conn.as_fd()))
    }
    fn restore(&mut self, _: &PortCtx<'_>, saved: FdRef, fds: &mut FdIn, _: &mut PortStatus) -> Result<OwnedFd, TakeoverError> {
        fds.take(saved)
    }
    fn resume(&mut self, _: &PortCtx<'_>, _: &mut OwnedFd) -> Result<(), Closed> {
        Ok(())
    }
}
"#;

    const UPLINK_PORT: &str = r#"//! A scratch uplink kind (tests/layers.rs builds it).
use std::io;

use switchyard_api::spec::scratch_link::ScratchLinkSpec;

use crate::dataplane::QueuePositions;
use crate::port::kernel::{Interface, KernelIf, Uplink};
use crate::port::registry::Build;
use crate::port::takeover::{FdIn, FdOut, TakeoverError};
use crate::port::Port;
use crate::queue::PortQueues;

/// A scratch uplink port.
pub fn port(spec: &ScratchLinkSpec, b: &Build<'_>) -> Box<dyn Port> {
    Box::new(KernelIf::new(b.name(), &spec.interface, ScratchLink))
}

struct ScratchLink;

impl Uplink for ScratchLink {
    const KIND: &'static str = "scratch-link";
    const REOPEN_ON_MTU: bool = false;
    type Saved = ();
    fn open(&mut self, at: &Interface<'_>) -> io::Result<(PortQueues, String)> {
        Ok((PortQueues::default(), at.name.to_string()))
    }
    fn save(&self, _: QueuePositions, _: &mut FdOut) -> Result<(), String> {
        Ok(())
    }
    fn restore(&mut self, at: &Interface<'_>, _: (), _: &mut FdIn) -> Result<(PortQueues, String), TakeoverError> {
        Ok((PortQueues::default(), at.name.to_string()))
    }
}
"#;

    const KINDS: &[Scratch] = &[
        Scratch {
            name: "socket",
            api_spec: (
                "api/src/spec/vhost_user.rs",
                &[
                    ("VhostUser", "Scratch"),
                    ("vhost-user", "scratch"),
                    ("vhostUser", "scratch"),
                ],
            ),
            own: &[
                ("api/src/spec/scratch.rs", ""),
                ("dataplane/src/port/scratch/mod.rs", SOCKET_PORT),
            ],
            edits: &[
                Edit {
                    file: "api/src/spec/mod.rs",
                    anchor: "    Vxlan(vxlan::VxlanSpec),\n",
                    with: "    Vxlan(vxlan::VxlanSpec),\n    Scratch(scratch::ScratchSpec),\n",
                },
                Edit {
                    file: "api/src/spec/socket.rs",
                    anchor: "    VhostUser(vhost_user::VhostUserSpec),\n",
                    with: "    VhostUser(vhost_user::VhostUserSpec),\n    Scratch(scratch::ScratchSpec),\n",
                },
                Edit {
                    file: "dataplane/src/port/mod.rs",
                    anchor: "    Vxlan => vxlan,\n",
                    with: "    Vxlan => vxlan,\n    Scratch => scratch,\n",
                },
            ],
        },
        Scratch {
            name: "uplink",
            api_spec: (
                "api/src/spec/af_packet.rs",
                &[("AfPacket", "ScratchLink"), ("af-packet", "scratch-link")],
            ),
            own: &[
                ("api/src/spec/scratch_link.rs", ""),
                ("dataplane/src/port/scratch_link/mod.rs", UPLINK_PORT),
            ],
            edits: &[
                Edit {
                    file: "api/src/spec/mod.rs",
                    anchor: "    Vxlan(vxlan::VxlanSpec),\n",
                    with: "    Vxlan(vxlan::VxlanSpec),\n    ScratchLink(scratch_link::ScratchLinkSpec),\n",
                },
                Edit {
                    file: "dataplane/src/port/mod.rs",
                    anchor: "    Vxlan => vxlan,\n",
                    with: "    Vxlan => vxlan,\n    ScratchLink => scratch_link,\n",
                },
            ],
        },
    ];

    fn workspace() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap()
            .to_path_buf()
    }

    /// Copies the workspace's crates (no build output, no fuzz crate).
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            let name = e.file_name();
            if ["target", "fuzz", ".git", "corpus"]
                .iter()
                .any(|n| name == *n)
            {
                continue;
            }
            let (src, dst) = (e.path(), to.join(&name));
            if e.file_type().unwrap().is_dir() {
                copy(&src, &dst);
            } else if e.file_type().unwrap().is_file() {
                std::fs::copy(&src, &dst).unwrap();
            }
        }
    }

    /// The lines of `after` that `before` does not have (as a multiset).
    fn lines_added(before: &str, after: &str) -> usize {
        let mut have: BTreeMap<&str, usize> = BTreeMap::new();
        for l in before.lines() {
            *have.entry(l).or_default() += 1;
        }
        after
            .lines()
            .filter(|l| match have.get_mut(l) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    false
                }
                _ => true,
            })
            .count()
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

    /// Makes a copy of the workspace with `kind`, returns the lines each
    /// file outside the kind's own modules needed.
    fn add_kind(root: &Path, kind: &Scratch) -> BTreeMap<String, usize> {
        let (from, renames) = kind.api_spec;
        let mut spec = std::fs::read_to_string(workspace().join(from)).unwrap();
        for (a, b) in renames {
            spec = spec.replace(a, b);
        }
        for (path, text) in kind.own {
            let p = root.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, if text.is_empty() { spec.as_str() } else { text }).unwrap();
        }
        let mut originals: BTreeMap<&str, String> = BTreeMap::new();
        for e in kind.edits {
            let p = root.join(e.file);
            let text = std::fs::read_to_string(&p).unwrap();
            originals.entry(e.file).or_insert_with(|| text.clone());
            assert_eq!(
                text.matches(e.anchor).count(),
                1,
                "{}: the scratch {} kind's edit finds {:?} once (the code moved: update the edit)",
                e.file,
                kind.name,
                e.anchor
            );
            std::fs::write(&p, text.replacen(e.anchor, e.with, 1)).unwrap();
        }
        originals
            .into_iter()
            .map(|(f, before)| {
                let after = std::fs::read_to_string(root.join(f)).unwrap();
                (f.to_string(), lines_added(&before, &after))
            })
            .collect()
    }

    #[test]
    fn a_scratch_kind_builds_with_the_documented_edits() {
        let mut wrong = Vec::new();
        for kind in KINDS {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path().join("ws");
            copy(&workspace(), &root);
            let found = add_kind(&root, kind);
            // Checked in a target directory of its own, kept between runs
            // (the outer `cargo test` holds the workspace's).
            let out = Command::new(env!("CARGO"))
                .args([
                    "check",
                    "--offline",
                    "--quiet",
                    "-p",
                    "switchyard-api",
                    "-p",
                    "switchyard",
                    "-p",
                    "switchyard-cni",
                    // The CNI's kubelet client (gRPC) lists no port kind:
                    // left out, the check is shorter.
                    "--no-default-features",
                ])
                .current_dir(&root)
                .env("CARGO_TARGET_DIR", workspace().join("target/kind-edits"))
                .env_remove("RUSTFLAGS")
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "the scratch {} kind does not build with its edits:\n{}",
                kind.name,
                String::from_utf8_lossy(&out.stderr)
            );
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
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n\n"));
    }
}
