//! Writing a pod's VRAM limits (`dmem.max`, torvalds/linux:Documentation/admin-guide/cgroup-v2.rst ("DMEM")).
//!
//! First the enable pass: every cgroup from the mount down to the pod's
//! parent gets `+dmem` in `cgroup.subtree_control`, only where `dmem` is not
//! listed yet. Then `dmem.max` of the pod cgroup, one region per `write(2)`,
//! each line read back and compared: a kernel that accepts a max below the
//! current usage without applying it (every kernel so far) is caught here.
//! A region that already has the wanted value is not written again.

use std::{
    collections::BTreeMap,
    io,
    os::fd::AsFd,
    path::{Path, PathBuf},
};

use super::{
    beneath::{self, ControlFiles, DMEM_MAX, SUBTREE_CONTROL},
    region::{self, Bdf, Value},
    resolve::{Held, PodCgroup},
};

/// Exactly what the enable pass writes.
pub const ENABLE: &[u8] = b"+dmem";

/// A write that did not happen or did not take. Paths are absolute files.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the kernel refused {line:?} in {path}: {source}")]
    Refused {
        path: PathBuf,
        line: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} is missing: the dmem controller is not enabled for this cgroup (no +dmem in its parent's cgroup.subtree_control)"
    )]
    NoDmemMax { path: PathBuf },
    #[error("refused {path}: a symlink ({source})")]
    Symlink {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("the cgroup of {path} went away: {source}")]
    Gone {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the limit did not take: wrote {region} {wrote} to {path}, it reads {read} (below the current usage?)"
    )]
    NotApplied {
        path: PathBuf,
        region: String,
        wrote: u64,
        read: String,
    },
}

/// What a successful apply did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Cgroups (relative to the mount) that got `+dmem`.
    pub enabled: Vec<PathBuf>,
    /// Regions written and verified.
    pub written: Vec<Bdf>,
    /// Regions that already had the value.
    pub unchanged: Vec<Bdf>,
}

/// ENOENT or ENODEV on a file of a held cgroup: the cgroup was removed.
fn gone(err: &io::Error) -> bool {
    err.kind() == io::ErrorKind::NotFound
        || err.raw_os_error() == Some(rustix::io::Errno::NODEV.raw_os_error())
}

/// A failed read (`line` is `None`) or write of `path` as a [`WriteError`].
fn failed(source: io::Error, path: &Path, line: Option<&[u8]>) -> WriteError {
    let path = path.to_path_buf();
    if beneath::is_escape(&source) {
        return WriteError::Symlink { path, source };
    }
    match line {
        None => WriteError::Read { path, source },
        Some(_) if gone(&source) => WriteError::Gone { path, source },
        Some(line) => WriteError::Refused {
            path,
            line: String::from_utf8_lossy(line).trim_end().to_owned(),
            source,
        },
    }
}

/// Writes `+dmem` into the `cgroup.subtree_control` of each of `ancestors`
/// that does not list `dmem` yet (top down: the parent must have it first).
///
/// # Errors
/// [`WriteError::Read`] or [`WriteError::Refused`] naming the file.
pub fn enable(
    files: &dyn ControlFiles,
    mount: &Path,
    ancestors: &[Held],
) -> Result<Vec<PathBuf>, WriteError> {
    let mut enabled = Vec::new();
    for held in ancestors {
        let path = mount.join(&held.rel).join(SUBTREE_CONTROL);
        let dir = held.fd.as_fd();
        let text = files
            .read(dir, SUBTREE_CONTROL)
            .map_err(|e| failed(e, &path, None))?;
        // The kernel lists `dmem`; a plain file (a fake tree) keeps `+dmem`.
        if text
            .split_whitespace()
            .any(|c| c.trim_start_matches('+') == "dmem")
        {
            continue;
        }
        files
            .write(dir, SUBTREE_CONTROL, ENABLE)
            .map_err(|e| failed(e, &path, Some(ENABLE)))?;
        enabled.push(held.rel.clone());
    }
    Ok(enabled)
}

/// Writes each of `limits` (bytes per GPU) to the pod's `dmem.max` and
/// verifies it by reading the file back.
///
/// # Errors
/// See [`WriteError`]; regions before the failing one stay written.
pub fn apply(
    files: &dyn ControlFiles,
    mount: &Path,
    pod: &PodCgroup,
    limits: &BTreeMap<Bdf, u64>,
) -> Result<Outcome, WriteError> {
    let path = mount.join(&pod.dir.rel).join(DMEM_MAX);
    let dir = pod.dir.fd.as_fd();
    let read = || {
        files.read(dir, DMEM_MAX).map_err(|source| {
            if source.kind() == io::ErrorKind::NotFound {
                WriteError::NoDmemMax { path: path.clone() }
            } else {
                failed(source, &path, None)
            }
        })
    };
    let mut outcome = Outcome::default();
    let before = read()?;
    for (&bdf, &bytes) in limits {
        let name = bdf.region();
        if region::value_of(&before, &name) == Some(Value::Bytes(bytes)) {
            outcome.unchanged.push(bdf);
            continue;
        }
        let line = region::max_line(bdf, bytes);
        files
            .write(dir, DMEM_MAX, line.as_bytes())
            .map_err(|e| failed(e, &path, Some(line.as_bytes())))?;
        let now = region::value_of(&read()?, &name);
        if now != Some(Value::Bytes(bytes)) {
            return Err(WriteError::NotApplied {
                path,
                region: name,
                wrote: bytes,
                read: now.map_or_else(|| "nothing for it".to_owned(), |v| v.to_string()),
            });
        }
        outcome.written.push(bdf);
    }
    Ok(outcome)
}
