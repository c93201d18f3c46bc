//! One-way stages in `plexus-meta`: reads `meta/src/**/*.rs` (test code left out), collects the
//! `crate::<module>` references of every top-level module and fails when the module graph has an
//! import circle or an edge that runs up the declared order ([`ORDER`], bottom first).
//!
//! A new top-level module must be placed in [`ORDER`]; an edge that runs up the order is an
//! error unless it is in [`KNOWN_BACK_EDGES`], a list that may only shrink (an entry no longer
//! seen in the source fails too, so it is removed when its edge is).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// meta's top-level modules, bottom (imports nothing of meta's) to top (front ends). A module
/// may import only modules listed before it.
const ORDER: &[&str] = &[
    // the version line of the binaries (build facts only)
    "build_info",
    // one CNI call's outcome for the metrics (events reported by the stages; imports nothing
    // of meta's)
    "outcome",
    // data: pod identity; the API client and its error (import nothing of meta's)
    "pod",
    "k8s",
    // the Unix-socket gRPC client the pod-resources and CRI clients share
    "grpc_unix",
    // MetaError: its own data and the k8s / pod-resources errors it wraps
    "error",
    // default-route netlink work, for attach
    "routes",
    // the planner: plan types (attachments, device map, NAD data, DRA devices) and the pure
    // steps from what the inputs read to the attachments (no API calls)
    "plan",
    // the node's NAD policy applied to a plan (host paths and resources; no API calls)
    "nad_guard",
    // saved plans, address claim releases not done yet, the per-call context
    "state",
    "claims_pending",
    "context",
    // inputs: device lookups, then the pod, NADs and devices from the API, caches or files
    "devices",
    "inputs",
    // stages after the plan
    "attach",
    "report",
    "address_guard",
    "pool_guard",
    "host_local_guard",
    "verbs",
    // front ends
    "daemon",
    "shim",
    "plugin",
    "cli",
];

/// Edges (from, to) that still run up [`ORDER`]. Only ever remove entries.
const KNOWN_BACK_EDGES: &[(&str, &str)] = &[];

/// Blanks comments and the contents of string and char literals, keeping line structure.
fn strip_comments_and_literals(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == b'/' && b.get(i + 1) == Some(&b'*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == b'*' && b.get(i + 1) == Some(&b'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == b'r'
            && (i == 0 || !is_ident(b[i - 1]))
            && matches!(b.get(i + 1), Some(b'"') | Some(b'#'))
        {
            // raw string r"…" / r#"…"#
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push(c as char);
                i += 1;
                continue;
            }
            j += 1;
            'raw: while j < b.len() {
                if b[j] == b'"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&b'#')) {
                    j += 1 + hashes;
                    break 'raw;
                }
                if b[j] == b'\n' {
                    out.push('\n');
                }
                j += 1;
            }
            out.push_str("\"\"");
            i = j;
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                } else if b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // char literal ('x', '\n', '\u{..}') or a lifetime ('a)
            if b.get(i + 1) == Some(&b'\\') {
                let mut j = i + 2;
                while j < b.len() && b[j] != b'\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("' '");
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push('\'');
                i += 1;
            }
        } else {
            out.push(c as char);
            i += 1;
        }
    }
    out
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Index just past the item starting at `from`: its `;` or its balanced `{ … }`.
fn item_end(b: &[u8], from: usize) -> usize {
    let mut i = from;
    while i < b.len() {
        match b[i] {
            b';' => return i + 1,
            b'{' => {
                let mut depth = 0;
                while i < b.len() {
                    match b[i] {
                        b'{' => depth += 1,
                        b'}' => {
                            depth -= 1;
                            if depth == 0 {
                                return i + 1;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
                return i;
            }
            _ => i += 1,
        }
    }
    i
}

/// Removes every item marked `#[cfg(test)]` (source already stripped of comments and
/// literals); returns the rest and the names of out-of-line `mod name;` items it removed.
fn strip_cfg_test(src: &str) -> (String, Vec<String>) {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut test_mods = Vec::new();
    let mut rest = src;
    while let Some(at) = rest.find(MARK) {
        out.push_str(&rest[..at]);
        let after = &rest[at + MARK.len()..];
        let end = item_end(after.as_bytes(), 0);
        let item = after[..end].trim();
        let words: Vec<&str> = item
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '#' || c == '['))
            .filter(|w| !w.is_empty())
            .collect();
        if item.ends_with(';') {
            if let Some(p) = words.iter().position(|w| *w == "mod") {
                if let Some(name) = words.get(p + 1) {
                    test_mods.push(name.to_string());
                }
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    (out, test_mods)
}

/// The first path segment of every `crate::…` reference (`use crate::{a, b::c}` gives a, b),
/// and of every `super::…` path that climbs to the crate root from a file `depth` modules deep.
fn crate_refs(src: &str, depth: usize) -> BTreeSet<String> {
    let b = src.as_bytes();
    let mut refs = BTreeSet::new();
    let mut from = 0;
    while let Some(pos) = src[from..].find("super::") {
        let at = from + pos;
        from = at + "super::".len();
        if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b':') {
            continue;
        }
        let mut climbs = 1;
        while src[from..].starts_with("super::") {
            climbs += 1;
            from += "super::".len();
        }
        if climbs >= depth {
            push_use_tree(&src[from..], &mut refs);
        }
    }
    let mut from = 0;
    while let Some(pos) = src[from..].find("crate::") {
        let at = from + pos;
        from = at + "crate::".len();
        if at > 0 && (is_ident(b[at - 1]) || b[at - 1] == b'$') {
            continue;
        }
        push_use_tree(&src[from..], &mut refs);
    }
    refs
}

/// The first segment of the path at the start of `rest`, or of each path in a `{ … }` group.
fn push_use_tree(rest: &str, refs: &mut BTreeSet<String>) {
    let b = rest.as_bytes();
    let mut i = 0;
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    if b.get(i) != Some(&b'{') {
        push_first_segment(&rest[i..], refs);
        return;
    }
    let end = item_end(b, i);
    let inner = &rest[i + 1..end.saturating_sub(1)];
    let mut depth = 0;
    let mut start = 0;
    for (k, ch) in inner.bytes().enumerate() {
        match ch {
            b'{' => depth += 1,
            b'}' => depth -= 1,
            b',' if depth == 0 => {
                push_first_segment(&inner[start..k], refs);
                start = k + 1;
            }
            _ => {}
        }
    }
    push_first_segment(&inner[start..], refs);
}

fn push_first_segment(s: &str, refs: &mut BTreeSet<String>) {
    let s = s.trim_start();
    let name: String = s
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    if !name.is_empty() && name != "self" {
        refs.insert(name);
    }
}

/// Every `.rs` file under `dir`, skipping `*_tests.rs` and out-of-line `#[cfg(test)]` modules.
fn source_files(dir: &Path, skip: &BTreeSet<PathBuf>, out: &mut Vec<(PathBuf, String)>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if skip.contains(&path) {
            continue;
        }
        if path.is_dir() {
            source_files(&path, skip, out);
        } else if path.extension().is_some_and(|e| e == "rs")
            && !path.to_string_lossy().ends_with("_tests.rs")
        {
            let raw = std::fs::read_to_string(&path).unwrap();
            out.push((path, raw));
        }
    }
}

/// meta's module graph: top-level module → the other top-level modules its non-test code names.
fn meta_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&src, &BTreeSet::new(), &mut files);
    // First pass: which out-of-line modules are test-only.
    let mut skip = BTreeSet::new();
    for (path, raw) in &files {
        let (_, test_mods) = strip_cfg_test(&strip_comments_and_literals(raw));
        let dir = match path.file_name().and_then(|n| n.to_str()) {
            Some("mod.rs") | Some("lib.rs") | Some("main.rs") => {
                path.parent().unwrap().to_path_buf()
            }
            _ => path.with_extension(""),
        };
        for m in test_mods {
            skip.insert(dir.join(format!("{m}.rs")));
            skip.insert(dir.join(&m));
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (path, raw) in &files {
        if skip.contains(path) {
            continue;
        }
        let rel = path.strip_prefix(&src).unwrap();
        let first = rel
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy();
        // lib.rs only declares modules; the binaries use the library by its name.
        if rel == Path::new("lib.rs") || rel == Path::new("main.rs") || first == "bin" {
            continue;
        }
        let module = first.trim_end_matches(".rs").to_string();
        let (code, _) = strip_cfg_test(&strip_comments_and_literals(raw));
        // How many modules deep the file is: `error.rs` and `report/mod.rs` 1, `k8s/pods.rs` 2.
        let mut depth = rel.components().count();
        if rel.file_name().is_some_and(|n| n == "mod.rs") {
            depth -= 1;
        }
        let node = graph.entry(module.clone()).or_default();
        for r in crate_refs(&code, depth) {
            if r != module {
                node.insert(r);
            }
        }
    }
    graph
}

/// A cycle in `graph` as a path `a → b → … → a`, if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in graph.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let start = stack.iter().position(|s| s == m).unwrap();
                    let mut cycle = stack[start..].to_vec();
                    cycle.push(m.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(m, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in graph.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(n, graph, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

/// Every problem with `graph` against `order` and the allowed back edges.
fn check(
    graph: &BTreeMap<String, BTreeSet<String>>,
    order: &[&str],
    allowed: &[(&str, &str)],
) -> Vec<String> {
    let rank = |m: &str| order.iter().position(|o| *o == m);
    let mut problems = Vec::new();
    let mut seen_allowed = BTreeSet::new();
    for (from, tos) in graph {
        let Some(rf) = rank(from) else {
            problems.push(format!("module `{from}` is not placed in ORDER"));
            continue;
        };
        for to in tos {
            let Some(rt) = rank(to) else {
                problems.push(format!(
                    "module `{to}` (used by `{from}`) is not placed in ORDER"
                ));
                continue;
            };
            if rt >= rf {
                if allowed.contains(&(from.as_str(), to.as_str())) {
                    seen_allowed.insert((from.clone(), to.clone()));
                } else {
                    problems.push(format!(
                        "`{from}` imports `{to}`, which sits above it in ORDER"
                    ));
                }
            }
        }
    }
    for (from, to) in allowed {
        if !seen_allowed.contains(&(from.to_string(), to.to_string())) {
            problems.push(format!(
                "known back edge `{from}` → `{to}` is gone: remove it from KNOWN_BACK_EDGES"
            ));
        }
    }
    if allowed.is_empty() {
        if let Some(cycle) = find_cycle(graph) {
            problems.push(format!("import circle: {}", cycle.join(" → ")));
        }
    }
    problems
}

#[test]
fn meta_modules_are_one_way() {
    let graph = meta_graph();
    for (from, tos) in &graph {
        eprintln!(
            "{from} → {}",
            tos.iter().cloned().collect::<Vec<_>>().join(", ")
        );
    }
    let problems = check(&graph, ORDER, KNOWN_BACK_EDGES);
    assert!(
        problems.is_empty(),
        "meta's stages are not one-way:\n{}",
        problems.join("\n")
    );
    // The graph is read from the real source: the lowest and highest modules are in it.
    assert!(graph.contains_key("pod") && graph["verbs"].contains("plan"));
}

fn graph_of(edges: &[(&str, &str)]) -> BTreeMap<String, BTreeSet<String>> {
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in edges {
        g.entry(a.to_string()).or_default().insert(b.to_string());
        g.entry(b.to_string()).or_default();
    }
    g
}

#[test]
fn checker_finds_a_cycle_and_an_upward_edge() {
    let g = graph_of(&[("a", "b"), ("b", "c"), ("c", "a"), ("d", "a")]);
    let cycle = find_cycle(&g).expect("a → b → c → a is a cycle");
    assert_eq!(cycle.first(), cycle.last());
    assert_eq!(cycle.len(), 4);
    let problems = check(&g, &["a", "b", "c", "d"], &[]);
    assert!(
        problems.iter().any(|p| p.contains("import circle")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("`a` imports `b`")),
        "{problems:?}"
    );
    // One-way graph: no problems; an allowed edge that no longer exists is reported.
    let ok = graph_of(&[("b", "a"), ("c", "a"), ("c", "b")]);
    assert!(find_cycle(&ok).is_none());
    assert!(check(&ok, &["a", "b", "c"], &[]).is_empty());
    assert_eq!(check(&ok, &["a", "b", "c"], &[("a", "c")]).len(), 1);
    // A module missing from the order is reported.
    assert!(check(&ok, &["a", "b"], &[])
        .iter()
        .any(|p| p.contains("`c`")));
}

#[test]
fn reader_skips_tests_comments_and_strings() {
    let src = r##"
use crate::{alpha::X, beta::{Y, Z}, self};
use crate::gamma;
// use crate::commented;
/* crate::block */
const S: &str = "crate::in_string";
const R: &str = r#"crate::raw"#;
fn f<'a>(c: char) -> bool { c == '"' && crate::delta::g() }
#[cfg(test)]
mod tests { use crate::testonly; }
#[cfg(test)]
mod helper;
fn h() { $crate::macro_path(); super::super::epsilon::f(); super::sibling::g(); }
use super::super::{zeta::A, eta};
"##;
    let (code, test_mods) = strip_cfg_test(&strip_comments_and_literals(src));
    let set =
        |names: &[&str]| -> BTreeSet<String> { names.iter().map(|s| s.to_string()).collect() };
    // Two modules deep: `super::super::epsilon` is the crate's `epsilon`, `super::sibling` not.
    assert_eq!(
        crate_refs(&code, 2),
        set(&["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"])
    );
    // Three deep: `super::super` stays inside the top-level module.
    assert_eq!(
        crate_refs(&code, 3),
        set(&["alpha", "beta", "gamma", "delta"])
    );
    assert_eq!(test_mods, vec!["helper".to_string()]);
}
