//! Finding a pod's cgroup (kubernetes/kubernetes:pkg/kubelet/cm/
//! pod_container_manager_linux.go, qos_container_manager_linux.go).
//!
//! The path comes from the fixed template of [`Layout`] and a validated
//! [`PodUid`]; nothing a caller sends is a path. The kubepods cgroup is opened
//! beneath the held cgroup mount, and each QoS candidate beneath kubepods,
//! all with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | ...`: a symlink planted
//! anywhere on the way, or a mount crossing, is refused rather than
//! followed. Exactly one candidate must exist.

use std::{
    io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
};

use super::{
    beneath,
    layout::{Layout, Qos},
    uid::PodUid,
};

/// Why no pod cgroup was found. Paths are absolute (mount included).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("no cgroup for pod {uid} under {kubepods} (tried {tried:?})")]
    NotFound {
        uid: PodUid,
        kubepods: PathBuf,
        tried: Vec<PathBuf>,
    },
    #[error("refused {path}: a symlink or a mount crossing on the way ({source})")]
    Refused {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("pod {uid} has a cgroup in more than one QoS class: {paths:?}")]
    Ambiguous { uid: PodUid, paths: Vec<PathBuf> },
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// A cgroup held open, with its path relative to the cgroup mount.
#[derive(Debug)]
pub struct Held {
    pub fd: OwnedFd,
    pub rel: PathBuf,
}

/// A pod's cgroup and every cgroup above it, each held open.
#[derive(Debug)]
pub struct PodCgroup {
    pub qos: Qos,
    pub dir: Held,
    /// From the cgroup mount itself down to the pod's parent.
    pub ancestors: Vec<Held>,
}

/// A failed open as a [`ResolveError`]: symlinks and escapes are refusals.
fn failed(source: io::Error, path: PathBuf) -> ResolveError {
    if beneath::is_escape(&source) {
        ResolveError::Refused { path, source }
    } else {
        ResolveError::Open { path, source }
    }
}

/// Opens `rel` beneath `dir`; `shown` is its path in messages.
fn open(dir: BorrowedFd<'_>, rel: &Path, shown: PathBuf) -> Result<OwnedFd, ResolveError> {
    beneath::open_dir(dir, rel).map_err(|source| failed(source, shown))
}

/// Finds the cgroup of `uid` under the kubepods cgroup of `layout`, beneath
/// the cgroup mount `root` (shown in messages as `mount`).
///
/// # Errors
/// [`ResolveError::NotFound`] when no QoS class has it, `Refused` when a
/// symlink or mount crossing is on the way, `Ambiguous` when more than one
/// class has it, `Open` for other errors.
pub fn find_pod(
    root: BorrowedFd<'_>,
    mount: &Path,
    layout: &Layout,
    uid: &PodUid,
) -> Result<PodCgroup, ResolveError> {
    let kubepods_rel = layout.kubepods();
    let kubepods = open(root, &kubepods_rel, mount.join(&kubepods_rel))?;
    let mut found = Vec::new();
    let mut tried = Vec::new();
    for qos in Qos::ALL {
        let rel = layout.pod_dir(qos, uid);
        let full = kubepods_rel.join(&rel);
        tried.push(mount.join(&full));
        match beneath::open_dir(kubepods.as_fd(), &rel) {
            Ok(fd) => found.push((qos, Held { fd, rel: full })),
            // Not there, or not a directory: not this class.
            Err(e) if is_absent(&e) => {}
            Err(e) => return Err(failed(e, mount.join(&full))),
        }
    }
    let (qos, dir) = match found.len() {
        0 => {
            return Err(ResolveError::NotFound {
                uid: uid.clone(),
                kubepods: mount.join(&kubepods_rel),
                tried,
            });
        }
        1 => found.remove(0),
        _ => {
            return Err(ResolveError::Ambiguous {
                uid: uid.clone(),
                paths: found.iter().map(|(_, h)| mount.join(&h.rel)).collect(),
            });
        }
    };
    let ancestors = ancestors(root, kubepods, mount, layout, qos)?;
    Ok(PodCgroup {
        qos,
        dir,
        ancestors,
    })
}

fn is_absent(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// The mount, the cgroups between it and kubepods, kubepods, and the QoS
/// cgroup of `qos` (if any), each held open.
fn ancestors(
    root: BorrowedFd<'_>,
    kubepods: OwnedFd,
    mount: &Path,
    layout: &Layout,
    qos: Qos,
) -> Result<Vec<Held>, ResolveError> {
    let mut held = Vec::new();
    for rel in layout.above_kubepods() {
        let fd = open(root, &rel, mount.join(&rel))?;
        held.push(Held { fd, rel });
    }
    let kubepods_rel = layout.kubepods();
    if let Some(qos_rel) = layout.qos_dir(qos) {
        let full = kubepods_rel.join(&qos_rel);
        let fd = open(kubepods.as_fd(), &qos_rel, mount.join(&full))?;
        held.push(Held {
            fd: kubepods,
            rel: kubepods_rel,
        });
        held.push(Held { fd, rel: full });
    } else {
        held.push(Held {
            fd: kubepods,
            rel: kubepods_rel,
        });
    }
    Ok(held)
}
