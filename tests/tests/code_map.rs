//! The code maps stay true to the tree (issue 24): every source path that
//! `README.md` or `docs/architecture.md` names in backticks exists, and
//! every top-level module of `gpud` and `plugin` is named in the README's
//! layout, so that a file moved or a module added shows up here rather
//! than in a newcomer's search.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

use std::{
    fs,
    path::{Path, PathBuf},
};

/// The workspace's folders a named path may start with.
const ROOTS: [&str; 11] = [
    "ipc/",
    "gpud/",
    "proto/",
    "plugin/",
    "tests/",
    "helm/",
    "systemd/",
    "packaging/",
    ".ci/",
    "docs/",
    "examples/",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

/// The backticked spans of `text` that look like a workspace path.
fn named_paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|span| ROOTS.iter().any(|root| span.starts_with(root)))
        .filter(|span| !span.contains([' ', '<', '*', '{', '$']))
        .map(|span| span.trim_end_matches([',', '.', ':']).to_owned())
        .collect()
}

/// The paths of `paths` that are neither a file nor a folder under `root`.
fn missing(root: &Path, paths: &[String]) -> Vec<String> {
    paths
        .iter()
        .filter(|path| !root.join(path).exists())
        .cloned()
        .collect()
}

#[test]
fn every_path_the_maps_name_exists() {
    let root = workspace();
    let mut report = String::new();
    for doc in ["README.md", "docs/architecture.md"] {
        let text = fs::read_to_string(root.join(doc)).unwrap();
        let paths = named_paths(&text);
        assert!(paths.len() > 10, "{doc}: too few paths found: {paths:?}");
        for path in missing(&root, &paths) {
            report.push_str(&format!("{doc} names {path}, which is not in the tree\n"));
        }
    }
    assert!(report.is_empty(), "{report}");
}

/// The top-level modules of a crate's `src/` (files and folders), without
/// the crate roots.
fn top_modules(src: &Path) -> Vec<String> {
    let mut modules: Vec<String> = fs::read_dir(src)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_owned();
            if path.is_dir() {
                Some(name)
            } else {
                let stem = name.strip_suffix(".rs")?;
                let root = matches!(stem, "lib" | "main" | "testutil");
                (!root && !path.with_extension("").is_dir()).then(|| stem.to_owned())
            }
        })
        .collect();
    modules.sort();
    modules
}

#[test]
fn the_readme_layout_names_every_top_level_module() {
    let root = workspace();
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let layout = readme
        .split("## Layout")
        .nth(1)
        .and_then(|rest| rest.split("```").nth(1))
        .unwrap();
    let mut report = String::new();
    for krate in ["gpud", "plugin"] {
        let block: String = layout
            .split(&format!("\n{krate}/"))
            .nth(1)
            .unwrap()
            .lines()
            .take_while(|line| line.is_empty() || line.starts_with(' ') || !line.contains('/'))
            .collect::<Vec<_>>()
            .join(" ");
        let modules = top_modules(&root.join(krate).join("src"));
        assert!(modules.len() > 5, "{krate}: {modules:?}");
        for module in modules {
            let named = block
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|word| word == module);
            if !named {
                report.push_str(&format!(
                    "README's layout of {krate}/ does not name {module}\n"
                ));
            }
        }
    }
    assert!(report.is_empty(), "{report}");
}

#[test]
fn a_missing_path_is_reported() {
    let paths = named_paths("see `plugin/src/nowhere.rs`, `plugin/src/lib.rs` and `x/y`");
    assert_eq!(paths, ["plugin/src/nowhere.rs", "plugin/src/lib.rs"]);
    assert_eq!(missing(&workspace(), &paths), ["plugin/src/nowhere.rs"]);
}
