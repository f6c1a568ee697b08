//! Which loader an image's command runs under, decided over its merged file
//! tree ([`Tree`]) alone.
//!
//! The command is found the way `execvp(3)` would inside the container: an
//! `argv[0]` with a `/` is taken as a path (relative to the working
//! directory), one without is looked up in `PATH`. Paths are resolved within
//! the image only: a symlink's target, absolute or relative, is read as a
//! path of the image, `..` stops at its root, and at most [`resolve::MAX_HOPS`]
//! links are followed (Linux's `MAXSYMLINKS`). A `#!` script is followed to
//! its interpreter ([`MAX_SCRIPT_DEPTH`] levels, as `binfmt_script` allows
//! few), an ELF file is judged by its `PT_INTERP`.
//!
//! The work is bounded whatever the image: the command's paths are held to
//! [`command`]'s bounds before anything is walked, one walk takes at most
//! [`resolve::MAX_WALK`] components, at most [`MAX_TRIPLETS`] multiarch
//! directories are searched for `libc.so.6`, and every walk and scan of the
//! tree stops at the inspection's deadline.

mod command;
mod resolve;
mod wrapper;

use std::{collections::BTreeSet, time::Instant};

use super::Loader;
use super::elf::{GlibcVersion, Interp};
use super::inspection::InspectError;
use super::layers::{FileKind, Node, Tree, basename};

pub(crate) use command::{Command, MAX_ARGS_KEPT};
#[cfg(test)]
pub(crate) use command::{MAX_COMPONENTS, MAX_PATH_ENTRIES};
#[cfg(test)]
pub(crate) use resolve::MAX_WALK;
use resolve::absolute;
pub(crate) use resolve::{ResolveError, Walk};

pub(crate) const MAX_SCRIPT_DEPTH: u32 = 4;
/// Programs that start the next ([`wrapper`]) followed from argv[0]: `sh -c
/// "exec tini -- env A=1 prog"` is three.
pub(crate) const MAX_WRAPPERS: u32 = 4;
/// Multiarch directories (`/usr/lib/<triplet>`) searched for `libc.so.6`:
/// Debian's multiarch tuples number about 20
/// (`wiki.debian.org/Multiarch/Tuples`) and an image holds one or two.
pub(crate) const MAX_TRIPLETS: usize = 64;
/// Tree entries scanned between two looks at the deadline.
const SCAN_STRIDE: usize = 4096;

fn unknown(why: String) -> (Loader, String) {
    (Loader::Unknown { why: why.clone() }, why)
}

/// The loader `cmd` runs under in `tree`, and how that was told.
///
/// # Errors
/// [`InspectError::OutOfTime`] when `deadline` passes before the answer:
/// every path walked and every scan of the tree looks at it.
pub(crate) fn classify(
    tree: &Tree,
    cmd: &Command,
    deadline: Instant,
) -> Result<(Loader, String), InspectError> {
    let walk = Walk::new(tree, deadline);
    let found = judge(&walk, cmd);
    if walk.expired() {
        return Err(InspectError::OutOfTime {
            stage: "resolving the command",
        });
    }
    Ok(found)
}

fn judge(walk: &Walk<'_>, cmd: &Command) -> (Loader, String) {
    let Some(argv0) = cmd.argv0.as_deref() else {
        return by_loaders(walk, "no Entrypoint or Cmd".to_owned());
    };
    judge_program(walk, cmd, argv0, &cmd.args, 0, cmd.origin.to_owned())
}

/// Judges the program `argv0` run with `args`, reached as `evidence` says:
/// the program it starts when it is a wrapper ([`wrapper`]), else itself.
fn judge_program(
    walk: &Walk<'_>,
    cmd: &Command,
    argv0: &str,
    args: &[String],
    hops: u32,
    evidence: String,
) -> (Loader, String) {
    // The config's argv[0] was bounded with the rest of the command; one a
    // wrapper names is bounded here, before it is walked.
    if let Err(e) = command::bounded_path("argv[0]", argv0) {
        return unknown(format!("{evidence}: {e}"));
    }
    if cmd.path_unknown && !argv0.contains('/') {
        return unknown(format!(
            "{evidence} {argv0}: looked up in a PATH that the pod sets from a source the plugin \
             cannot read (envFrom or valueFrom)"
        ));
    }
    let located = walk
        .locate(cmd, argv0)
        .and_then(|path| match walk.find_file(&path) {
            Err(ResolveError::Missing(_)) => Err(ResolveError::Missing(path)),
            Ok((real, _)) => Ok((path, real)),
            Err(_) => Ok((path.clone(), path)),
        });
    let (path, real) = match located {
        Ok(found) => found,
        Err(ResolveError::Missing(what)) => {
            return by_loaders(walk, format!("{evidence} {what} not found"));
        }
        Err(e) => return unknown(format!("{evidence} {argv0}: {e}")),
    };
    let evidence = format!("{evidence} {path}");
    match wrapper::next(basename(argv0), basename(&real), args) {
        wrapper::Next::Itself => follow(walk, cmd, &path, 0, evidence),
        wrapper::Next::Unknowable(why) => unknown(format!("{evidence}: {why}")),
        wrapper::Next::Runs { argv, how } => match argv.split_first() {
            Some((next, rest)) if hops < MAX_WRAPPERS => {
                judge_program(walk, cmd, next, rest, hops + 1, format!("{evidence}{how}"))
            }
            _ => unknown(format!(
                "{evidence}: more than {MAX_WRAPPERS} programs that each start the next"
            )),
        },
    }
}

/// Judges the file at `path`, reached as `evidence` says.
fn follow(
    walk: &Walk<'_>,
    cmd: &Command,
    path: &str,
    depth: u32,
    evidence: String,
) -> (Loader, String) {
    let (real, file) = match walk.find_file(path) {
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
            Interp::Path(interp) => by_interpreter(walk, interp, evidence),
            Interp::BeyondPrefix => unknown(format!("{evidence}: PT_INTERP beyond the bytes read")),
        },
        FileKind::Script(s) if depth < MAX_SCRIPT_DEPTH => {
            let interp = absolute(&cmd.working_dir, &s.interpreter);
            let via_env = s
                .arg
                .as_deref()
                .filter(|a| basename(&interp) == "env" && !a.starts_with('-'));
            match via_env {
                Some(prog) => match walk.locate(cmd, prog) {
                    Ok(p) => follow(walk, cmd, &p, depth + 1, format!("{evidence} -> env {p}")),
                    Err(e) => unknown(format!("{evidence} -> env: {e}")),
                },
                None => {
                    let next = format!("{evidence} -> script interpreter {interp}");
                    follow(walk, cmd, &interp, depth + 1, next)
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

fn by_interpreter(walk: &Walk<'_>, interp: &str, evidence: String) -> (Loader, String) {
    let name = basename(interp);
    let evidence = format!("{evidence} -> interpreter {interp}");
    if is_musl_loader(name) {
        (Loader::Musl, evidence)
    } else if is_glibc_loader(name) {
        glibc(walk, evidence)
    } else {
        unknown(format!("{evidence}: not a glibc or musl loader"))
    }
}

/// Loader for an image whose command is not known: from the loaders the
/// image holds.
fn by_loaders(walk: &Walk<'_>, why: String) -> (Loader, String) {
    let mut glibc_at = None;
    let mut musl_at = None;
    for (i, (path, node)) in walk.tree.iter().enumerate() {
        if i % SCAN_STRIDE == 0 && walk.on_time().is_err() {
            break;
        }
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
        (Some(g), None) => glibc(walk, format!("{why}; image has only glibc's loader {g}")),
        (Some(g), Some(m)) => unknown(format!("{why}; image has both {g} and {m}")),
    }
}

/// The directories searched for `libc.so.6`: multiarch ones first.
fn libc_dirs(walk: &Walk<'_>) -> Result<Vec<String>, String> {
    let mut triplets = BTreeSet::new();
    for (i, (path, node)) in walk.tree.iter().enumerate() {
        if i % SCAN_STRIDE == 0 && walk.on_time().is_err() {
            break;
        }
        let Some(rest) = path
            .strip_prefix("/usr/lib/")
            .or_else(|| path.strip_prefix("/lib/"))
        else {
            continue;
        };
        if !rest.contains('/') && rest.contains("-linux-") && *node != Node::Other {
            triplets.insert(rest.to_owned());
            if triplets.len() > MAX_TRIPLETS {
                return Err(format!(
                    "more than {MAX_TRIPLETS} multiarch directories in /lib and /usr/lib (MAX_TRIPLETS)"
                ));
            }
        }
    }
    let mut dirs = Vec::new();
    for t in &triplets {
        dirs.push(format!("/lib/{t}"));
        dirs.push(format!("/usr/lib/{t}"));
    }
    dirs.extend(["/lib64", "/usr/lib64", "/lib", "/usr/lib"].map(str::to_owned));
    Ok(dirs)
}

/// The copies of `libc.so.6` in the image: (path looked up, versions).
fn libc_copies(walk: &Walk<'_>) -> Result<Vec<(String, GlibcVersion)>, String> {
    let mut seen = BTreeSet::new();
    let mut copies = Vec::new();
    for dir in libc_dirs(walk)? {
        let candidate = format!("{dir}/libc.so.6");
        let Ok((real, file)) = walk.find_file(&candidate) else {
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
fn glibc(walk: &Walk<'_>, evidence: String) -> (Loader, String) {
    let copies = match libc_copies(walk) {
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
