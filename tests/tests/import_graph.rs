//! No import circles between the modules of a crate (issue 24): within
//! each of `ipc`, `proto`, `gpud` and `plugin`, the graph of which module's
//! code names which other module (`use` trees and inline `crate::`,
//! `super::` and `self::` paths; comments and test modules left out) has
//! no cycle. A module naming its own ancestor is not an edge: a folder's
//! `mod.rs` is where its children's shared items live.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

type Graph = BTreeMap<String, BTreeSet<String>>;

#[test]
fn no_crate_has_an_import_circle() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut report = String::new();
    for krate in ["ipc", "proto", "gpud", "plugin"] {
        let graph = graph(&workspace.join(krate).join("src"));
        assert!(graph.len() > 1, "{krate}: no modules found");
        for cycle in cycles(&graph) {
            report.push_str(&format!("{krate}: {}\n", cycle.join(", ")));
            for module in &cycle {
                let within: Vec<&String> =
                    graph[module].iter().filter(|m| cycle.contains(m)).collect();
                report.push_str(&format!("  {module} names {within:?}\n"));
            }
        }
    }
    assert!(report.is_empty(), "import circles:\n{report}");
}

#[test]
fn a_circle_is_found() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    fs::create_dir_all(src.join("a")).unwrap();
    fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    fs::write(src.join("a/mod.rs"), "mod c;\nuse crate::b::Thing;\n").unwrap();
    fs::write(src.join("a/c.rs"), "use super::super::b;\n").unwrap();
    // A comment naming crate::a is no edge; the inline path is.
    let b = "// crate::a::Nope\nfn f() { crate::a::c::g(); }\n";
    fs::write(src.join("b.rs"), b).unwrap();
    let first = graph(src);
    assert_eq!(cycles(&first), vec![vec!["a::c", "b"]], "{first:?}");
    fs::write(src.join("b.rs"), "// crate::a::Nope\nfn f() {}\n").unwrap();
    assert!(cycles(&graph(src)).is_empty());
    // A renamed import and a test module are read as they should be.
    let b = "use crate::a::{c::{self as d}};\n#[cfg(test)]\nmod tests { use crate::a; }\n";
    fs::write(src.join("b.rs"), b).unwrap();
    assert_eq!(cycles(&graph(src)), vec![vec!["a::c", "b"]]);
    fs::write(
        src.join("b.rs"),
        "#[cfg(test)]\nmod tests { use crate::a::c; }\n",
    )
    .unwrap();
    assert!(cycles(&graph(src)).is_empty());
}

/// Every module of the crate under `src`, with the modules its code names.
fn graph(src: &Path) -> Graph {
    let files = rust_files(src);
    let modules: BTreeMap<String, PathBuf> = files
        .iter()
        .filter(|f| !is_test_file(f))
        .map(|f| (module_of(src, f), f.clone()))
        .collect();
    let mut graph = Graph::new();
    for (module, file) in &modules {
        let text = code_only(&fs::read_to_string(file).unwrap());
        let here: Vec<&str> = module.split("::").filter(|s| !s.is_empty()).collect();
        let mut named = BTreeSet::new();
        for path in paths_in(&text) {
            if let Some(target) = resolve(&path, &here, &modules) {
                let ancestor = module == &target || module.starts_with(&format!("{target}::"));
                if !ancestor && !target.is_empty() {
                    named.insert(target);
                }
            }
        }
        graph.insert(module.clone(), named);
    }
    graph
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Unit-test files (`tests.rs`, `*_tests.rs`, anything under `tests/`).
fn is_test_file(file: &Path) -> bool {
    let stem = file.file_stem().unwrap().to_string_lossy();
    stem == "tests" || stem.ends_with("_tests") || file.iter().any(|c| c == "tests")
}

/// `a/b.rs` and `a/b/mod.rs` are `a::b`; `lib.rs` and `main.rs` the root.
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|c| c.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts.join("::")
}

/// The text without comments and without the `#[cfg(test)]` module
/// (test modules come last in a file here).
fn code_only(text: &str) -> String {
    let lines: Vec<&str> = text.lines().map(str::trim_start).collect();
    let mut out = String::new();
    for (n, line) in lines.iter().enumerate() {
        if line.starts_with("#[cfg(test)]") && test_module_follows(&lines[n + 1..]) {
            break;
        }
        let code = line.find("//").map_or(*line, |at| &line[..at]);
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Whether the first line after the attributes declares a module.
fn test_module_follows(lines: &[&str]) -> bool {
    lines
        .iter()
        .find(|l| !l.starts_with("#["))
        .is_some_and(|l| l.starts_with("mod ") || l.starts_with("pub(crate) mod "))
}

/// Every `crate::`/`super::`/`self::` path: each leaf of a `use` tree, and
/// each inline path elsewhere.
fn paths_in(text: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(at) = next_use(rest) {
        inline_paths(&rest[..at], &mut out);
        let stmt_end = rest[at..].find(';').map_or(rest.len(), |e| at + e);
        let words = rest[at + 4..stmt_end].split_whitespace();
        let tree = words.collect::<Vec<_>>().join(" ").replace(" as ", "@");
        let tree: String = tree.chars().filter(|c| !c.is_whitespace()).collect();
        expand(&tree, &mut Vec::new(), &mut out);
        rest = &rest[(stmt_end + 1).min(rest.len())..];
    }
    inline_paths(rest, &mut out);
    out.retain(|p| {
        matches!(
            p.first().map(String::as_str),
            Some("crate" | "super" | "self")
        )
    });
    out
}

/// Where the next `use` keyword starts.
fn next_use(text: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = text[from..].find("use ") {
        let at = from + found;
        let before = text[..at].chars().next_back();
        if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_')) {
            return Some(at);
        }
        from = at + 4;
    }
    None
}

/// The leaves of `use` tree `tree` (whitespace removed, `as` as `@`)
/// under `prefix`.
fn expand(tree: &str, prefix: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    let Some(open) = tree.find('{') else {
        let leaf = tree.split('@').next().unwrap_or(tree);
        if leaf == "self" {
            out.push(prefix.clone());
            return;
        }
        let mut path = prefix.clone();
        path.extend(
            leaf.split("::")
                .filter(|s| !s.is_empty())
                .map(str::to_owned),
        );
        out.push(path);
        return;
    };
    let head = &tree[..open];
    let depth = prefix.len();
    prefix.extend(
        head.split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned),
    );
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    for item in split_top(inner).into_iter().filter(|i| !i.is_empty()) {
        expand(item, prefix, out);
    }
    prefix.truncate(depth);
}

/// `a, b::{c, d}, e` split at its top-level commas.
fn split_top(list: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0usize, 0);
    for (i, c) in list.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&list[start..]);
    parts
}

/// Inline paths such as `crate::a::b(..)` or `super::x::Y`.
fn inline_paths(text: &str, out: &mut Vec<Vec<String>>) {
    let bytes = text.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        if !ident(bytes[i]) || (i > 0 && (ident(bytes[i - 1]) || bytes[i - 1] == b':')) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len()
            && (ident(bytes[i]) || (bytes[i] == b':' && bytes.get(i + 1) == Some(&b':')))
        {
            i += if bytes[i] == b':' { 2 } else { 1 };
        }
        let path: Vec<String> = text[start..i]
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if path.len() > 1 {
            out.push(path);
        }
    }
}

/// The module a path names (the longest prefix that is a module).
fn resolve(path: &[String], here: &[&str], modules: &BTreeMap<String, PathBuf>) -> Option<String> {
    let mut base: Vec<String> = match path.first()?.as_str() {
        "crate" => Vec::new(),
        "self" | "super" => here.iter().map(|s| (*s).to_owned()).collect(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        base.pop()?;
    }
    while rest.first().is_some_and(|s| s == "super") {
        base.pop()?;
        rest = &rest[1..];
    }
    let mut best = modules
        .contains_key(&base.join("::"))
        .then(|| base.join("::"));
    for segment in rest {
        base.push(segment.clone());
        let name = base.join("::");
        if !modules.contains_key(&name) {
            break;
        }
        best = Some(name);
    }
    best
}

/// Each strongly connected set of two or more modules, sorted.
fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    let mut sets = Vec::new();
    let mut done = BTreeSet::new();
    for start in graph.keys() {
        if done.contains(start) {
            continue;
        }
        let from = reachable(graph, start);
        let set: Vec<String> = from
            .iter()
            .filter(|m| reachable(graph, m).contains(start))
            .cloned()
            .collect();
        done.extend(set.iter().cloned());
        if set.len() > 1 {
            sets.push(set);
        }
    }
    sets
}

/// `start` and every module reachable from it.
fn reachable(graph: &Graph, start: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::from([start.to_owned()]);
    let mut todo = vec![start.to_owned()];
    while let Some(m) = todo.pop() {
        for next in graph.get(&m).into_iter().flatten() {
            if seen.insert(next.clone()) {
                todo.push(next.clone());
            }
        }
    }
    seen
}
