//! Which loader an image's command runs under, decided over its merged file
//! tree ([`Tree`]) alone.
//!
//! The command is found the way `execvp(3)` would inside the container: an
//! `argv[0]` with a `/` is taken as a path (relative to the working
//! directory), one without is looked up in `PATH`. Paths are resolved within
//! the image only: a symlink's target, absolute or relative, is read as a
//! path of the image, `..` stops at its root, and at most [`MAX_HOPS`]
//! links are followed (Linux's `MAXSYMLINKS`). A `#!` script is followed to
//! its interpreter ([`MAX_SCRIPT_DEPTH`] levels, as `binfmt_script` allows
//! few), an ELF file is judged by its `PT_INTERP`.

use std::collections::BTreeSet;

use super::Loader;
use super::elf::{GlibcVersion, Interp};
use super::layers::{FileKind, FileSummary, Node, Tree, basename, normalize};

pub(crate) const MAX_HOPS: u32 = 40;
pub(crate) const MAX_SCRIPT_DEPTH: u32 = 4;
/// `PATH` when the config sets none (what Docker and containerd use).
pub(crate) const DEFAULT_PATH: &str =
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What the container runs, from its image config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Command {
    /// `argv[0]`: `None` when the config has neither `Entrypoint` nor `Cmd`.
    pub(crate) argv0: Option<String>,
    pub(crate) working_dir: String,
    pub(crate) path: String,
}

impl Default for Command {
    fn default() -> Self {
        Self {
            argv0: None,
            working_dir: "/".to_owned(),
            path: DEFAULT_PATH.to_owned(),
        }
    }
}

/// Why a path did not lead to a regular file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResolveError {
    #[error("{0} is not in the image")]
    Missing(String),
    #[error("{0}: more than {MAX_HOPS} symlinks (a loop?)")]
    Loop(String),
    #[error("{0} is not a regular file")]
    NotFile(String),
    #[error("{0}: a path component is not a directory")]
    NotDir(String),
}

fn join(parts: &[String]) -> String {
    format!("/{}", parts.join("/"))
}

/// Follows `start` (absolute) through the tree's symlinks and hard links:
/// the final path and what is there (`None`: nothing).
fn resolve<'t>(tree: &'t Tree, start: &str) -> Result<(String, Option<&'t Node>), ResolveError> {
    let mut todo: Vec<String> = start.split('/').rev().map(str::to_owned).collect();
    let mut done: Vec<String> = Vec::new();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        match c.as_str() {
            "" | "." => continue,
            ".." => {
                done.pop();
                continue;
            }
            _ => done.push(c),
        }
        let here = join(&done);
        match tree.get(&here) {
            Some(Node::Symlink(target)) => {
                hops += 1;
                if hops > MAX_HOPS {
                    return Err(ResolveError::Loop(start.to_owned()));
                }
                done.pop();
                if target.starts_with('/') {
                    done.clear();
                }
                todo.extend(target.split('/').rev().map(str::to_owned));
            }
            None | Some(Node::Dir) => {}
            Some(_) if todo.iter().any(|c| !c.is_empty() && c != ".") => {
                return Err(ResolveError::NotDir(here));
            }
            Some(_) => {}
        }
    }
    let mut path = join(&done);
    let mut node = if done.is_empty() {
        Some(&Node::Dir)
    } else {
        tree.get(&path)
    };
    while let Some(Node::Hardlink(to)) = node {
        hops += 1;
        if hops > MAX_HOPS {
            return Err(ResolveError::Loop(start.to_owned()));
        }
        path.clone_from(to);
        node = tree.get(&path);
    }
    Ok((path, node))
}

/// The regular file at `path`: its final path and summary.
pub(crate) fn find_file<'t>(
    tree: &'t Tree,
    path: &str,
) -> Result<(String, &'t FileSummary), ResolveError> {
    match resolve(tree, path)? {
        (real, Some(Node::File(f))) => Ok((real, f)),
        (real, None) => Err(ResolveError::Missing(real)),
        (real, Some(_)) => Err(ResolveError::NotFile(real)),
    }
}

/// `rel` made absolute against the directory `dir`.
fn absolute(dir: &str, rel: &str) -> String {
    if rel.starts_with('/') {
        return rel.to_owned();
    }
    normalize(&format!("{dir}/{rel}")).unwrap_or_else(|| "/".to_owned())
}

/// Where `argv0` is, as `execvp` finds it: the path looked up (before
/// symlinks are followed).
pub(crate) fn locate(tree: &Tree, cmd: &Command, argv0: &str) -> Result<String, ResolveError> {
    if argv0.contains('/') {
        return Ok(absolute(&cmd.working_dir, argv0));
    }
    for dir in cmd.path.split(':') {
        let dir = if dir.is_empty() { "." } else { dir };
        let candidate = absolute(&absolute(&cmd.working_dir, dir), argv0);
        if find_file(tree, &candidate).is_ok() {
            return Ok(candidate);
        }
    }
    Err(ResolveError::Missing(format!(
        "{argv0} (in PATH {})",
        cmd.path
    )))
}

fn unknown(why: String) -> (Loader, String) {
    (Loader::Unknown { why: why.clone() }, why)
}

/// The loader `cmd` runs under in `tree`, and how that was told.
pub(crate) fn classify(tree: &Tree, cmd: &Command) -> (Loader, String) {
    let Some(argv0) = cmd.argv0.as_deref() else {
        return by_loaders(tree, "no Entrypoint or Cmd".to_owned());
    };
    let located = locate(tree, cmd, argv0).and_then(|path| match find_file(tree, &path) {
        Err(ResolveError::Missing(_)) => Err(ResolveError::Missing(path)),
        _ => Ok(path),
    });
    match located {
        Ok(path) => follow(tree, cmd, &path, 0, format!("entrypoint {path}")),
        Err(ResolveError::Missing(what)) => {
            by_loaders(tree, format!("entrypoint {what} not found"))
        }
        Err(e) => unknown(format!("entrypoint {argv0}: {e}")),
    }
}

/// Judges the file at `path`, reached as `evidence` says.
fn follow(
    tree: &Tree,
    cmd: &Command,
    path: &str,
    depth: u32,
    evidence: String,
) -> (Loader, String) {
    let (real, file) = match find_file(tree, path) {
        Ok(found) => found,
        Err(e) => return unknown(format!("{evidence}: {e}")),
    };
    let mut evidence = evidence;
    if real != path {
        evidence.push_str(&format!(" (-> {real})"));
    }
    if !file.executable() {
        return unknown(format!("{evidence}: not executable"));
    }
    match &file.kind {
        FileKind::Elf(elf) => match &elf.interp {
            Interp::Absent => (
                Loader::Static,
                format!("{evidence} is static (no PT_INTERP)"),
            ),
            Interp::Path(interp) => by_interpreter(tree, interp, evidence),
            Interp::BeyondPrefix => unknown(format!("{evidence}: PT_INTERP beyond the bytes read")),
        },
        FileKind::Script(s) if depth < MAX_SCRIPT_DEPTH => {
            let interp = absolute(&cmd.working_dir, &s.interpreter);
            let via_env = s
                .arg
                .as_deref()
                .filter(|a| basename(&interp) == "env" && !a.starts_with('-'));
            match via_env {
                Some(prog) => match locate(tree, cmd, prog) {
                    Ok(p) => follow(tree, cmd, &p, depth + 1, format!("{evidence} -> env {p}")),
                    Err(e) => unknown(format!("{evidence} -> env: {e}")),
                },
                None => {
                    let next = format!("{evidence} -> script interpreter {interp}");
                    follow(tree, cmd, &interp, depth + 1, next)
                }
            }
        }
        FileKind::Script(_) => unknown(format!("{evidence}: more than {MAX_SCRIPT_DEPTH} scripts")),
        FileKind::BadElf(why) => unknown(format!("{evidence}: {why}")),
        FileKind::Other | FileKind::NotRead => {
            unknown(format!("{evidence}: neither an ELF file nor a script"))
        }
    }
}

pub(crate) fn is_musl_loader(name: &str) -> bool {
    name.starts_with("ld-musl-") && name.ends_with(".so.1")
}

pub(crate) fn is_glibc_loader(name: &str) -> bool {
    (name.starts_with("ld-linux") && name.contains(".so")) || name.starts_with("ld64.so")
}

fn by_interpreter(tree: &Tree, interp: &str, evidence: String) -> (Loader, String) {
    let name = basename(interp);
    let evidence = format!("{evidence} -> interpreter {interp}");
    if is_musl_loader(name) {
        (Loader::Musl, evidence)
    } else if is_glibc_loader(name) {
        glibc(tree, evidence)
    } else {
        unknown(format!("{evidence}: not a glibc or musl loader"))
    }
}

/// Loader for an image whose command is not known: from the loaders the
/// image holds.
fn by_loaders(tree: &Tree, why: String) -> (Loader, String) {
    let mut glibc_at = None;
    let mut musl_at = None;
    for (path, node) in tree.iter() {
        if *node == Node::Dir {
            continue;
        }
        let name = basename(path);
        if is_glibc_loader(name) {
            glibc_at.get_or_insert(path);
        } else if is_musl_loader(name) {
            musl_at.get_or_insert(path);
        }
    }
    match (glibc_at, musl_at) {
        (None, None) => (Loader::Static, format!("{why}; no loader in the image")),
        (None, Some(m)) => (
            Loader::Musl,
            format!("{why}; image has only musl's loader {m}"),
        ),
        (Some(g), None) => glibc(tree, format!("{why}; image has only glibc's loader {g}")),
        (Some(g), Some(m)) => unknown(format!("{why}; image has both {g} and {m}")),
    }
}

/// The directories searched for `libc.so.6`: multiarch ones first.
fn libc_dirs(tree: &Tree) -> Vec<String> {
    let mut triplets = BTreeSet::new();
    for (path, node) in tree.iter() {
        let Some(rest) = path
            .strip_prefix("/usr/lib/")
            .or_else(|| path.strip_prefix("/lib/"))
        else {
            continue;
        };
        if !rest.contains('/') && rest.contains("-linux-") && *node != Node::Other {
            triplets.insert(rest.to_owned());
        }
    }
    let mut dirs = Vec::new();
    for t in &triplets {
        dirs.push(format!("/lib/{t}"));
        dirs.push(format!("/usr/lib/{t}"));
    }
    dirs.extend(["/lib64", "/usr/lib64", "/lib", "/usr/lib"].map(str::to_owned));
    dirs
}

/// The copies of `libc.so.6` in the image: (path looked up, versions).
fn libc_copies(tree: &Tree) -> Result<Vec<(String, GlibcVersion)>, String> {
    let mut seen = BTreeSet::new();
    let mut copies = Vec::new();
    for dir in libc_dirs(tree) {
        let candidate = format!("{dir}/libc.so.6");
        let Ok((real, file)) = find_file(tree, &candidate) else {
            continue;
        };
        if !seen.insert(real.clone()) {
            continue;
        }
        let newest = match &file.glibc {
            Some(Ok(v)) => v.iter().max().copied(),
            Some(Err(why)) => return Err(format!("{candidate}: {why}")),
            None => return Err(format!("{candidate} (-> {real}) was not read")),
        };
        let newest = newest.ok_or_else(|| format!("{candidate} defines no GLIBC_ version"))?;
        copies.push((candidate, newest));
    }
    if copies.is_empty() {
        return Err("no libc.so.6 in /lib/<triplet>, /lib64, /lib or their /usr twins".to_owned());
    }
    Ok(copies)
}

/// glibc with the version its `libc.so.6` defines: the lowest newest
/// version when copies disagree.
fn glibc(tree: &Tree, evidence: String) -> (Loader, String) {
    let copies = match libc_copies(tree) {
        Ok(c) => c,
        Err(why) => return unknown(format!("{evidence}; {why}")),
    };
    let Some((path, version)) = copies.iter().min_by_key(|(_, v)| *v) else {
        return unknown(format!("{evidence}; no libc.so.6"));
    };
    let mut evidence = format!("{evidence}; {path} defines {version}");
    if copies.iter().any(|(_, v)| v != version) {
        evidence.push_str(&format!(" (the lowest of {} copies)", copies.len()));
    }
    let loader = Loader::Glibc {
        major: version.major,
        minor: version.minor,
    };
    (loader, evidence)
}

#[cfg(test)]
mod tests;
