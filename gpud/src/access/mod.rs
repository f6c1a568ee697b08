//! What the unprivileged plugin needs in kubelet's root-owned directories,
//! given by amd-gpud (root on the host) instead of a root init container:
//!
//! - the device-plugin directory (`<kubelet>/device-plugins`, root, 0750):
//!   `rwx` for the plugin's UID on the directory (to create and replace its
//!   socket) and `rw` on `kubelet.sock` (connecting to a socket needs write
//!   permission on it);
//! - the pod-resources directory (`<kubelet>/pod-resources`): `x` on the
//!   directory and `rw` on its `kubelet.sock`.
//!
//! Each grant is one named-user entry in the file's POSIX access ACL; the
//! owner, group and other bits are untouched. Kubelet re-creates
//! `kubelet.sock` when it restarts (a fresh inode without our entry), and a
//! default ACL would not help (the new socket's mask follows kubelet's
//! umask), so [`keep`] checks again every few seconds and writes only when
//! an entry is missing. Symlinks are never followed; a directory that is
//! not a directory, or not owned by root, is left alone and reported.

pub mod acl;

use std::{
    io,
    os::unix::fs::{FileTypeExt, MetadataExt},
    path::{Path, PathBuf},
    time::Duration,
};

use tracing::{debug, info, warn};

use crate::HostPaths;

/// One directory and the sockets in it the plugin must reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub dir: PathBuf,
    /// Permissions on the directory (`rwx` bits 4, 2, 1).
    pub dir_perm: u16,
    /// Socket file names in the directory that the plugin connects to.
    pub sockets: Vec<String>,
}

/// The plugin's targets under the host's kubelet directory.
pub fn kubelet_targets(paths: &HostPaths) -> Vec<Target> {
    vec![
        Target {
            dir: paths.kubelet.join("device-plugins"),
            dir_perm: 7,
            sockets: vec!["kubelet.sock".to_owned()],
        },
        Target {
            dir: paths.kubelet.join("pod-resources"),
            dir_perm: 1,
            sockets: vec!["kubelet.sock".to_owned()],
        },
    ]
}

/// Why a grant was not made.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    #[error("{path} is not a {what} (refusing to change it)")]
    NotA { path: PathBuf, what: &'static str },
    #[error("{path} is owned by uid {owner}, not root (refusing to change it)")]
    NotRoot { path: PathBuf, owner: u32 },
    #[error("setting the ACL of {path}: {source}")]
    Acl {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Gives `uid` at least `perm` on `path` (a directory or a socket, checked
/// with `lstat`). Returns whether anything was written; a missing path is
/// `Ok(false)`.
///
/// # Errors
/// The wrong file type or owner, or an ACL that cannot be read or written.
pub fn grant(path: &Path, dir: bool, uid: u32, perm: u16) -> Result<bool, AccessError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(_) => return Ok(false),
    };
    let kind_ok = if dir {
        meta.file_type().is_dir()
    } else {
        meta.file_type().is_socket()
    };
    if !kind_ok {
        let what = if dir { "directory" } else { "socket" };
        return Err(AccessError::NotA {
            path: path.to_path_buf(),
            what,
        });
    }
    if meta.uid() != 0 {
        return Err(AccessError::NotRoot {
            path: path.to_path_buf(),
            owner: meta.uid(),
        });
    }
    let wrap = |source| AccessError::Acl {
        path: path.to_path_buf(),
        source,
    };
    let mut current = acl::read(path, meta.mode()).map_err(wrap)?;
    if current.user_perm(uid) & perm == perm {
        return Ok(false);
    }
    current.grant_user(uid, perm);
    acl::write(path, &current).map_err(wrap)?;
    Ok(true)
}

/// Applies every target once; returns the paths changed.
pub fn ensure(targets: &[Target], uid: u32) -> Vec<PathBuf> {
    let mut changed = Vec::new();
    for target in targets {
        let mut grants = vec![(target.dir.clone(), true, target.dir_perm)];
        grants.extend(
            target
                .sockets
                .iter()
                .map(|s| (target.dir.join(s), false, 6)),
        );
        for (path, dir, perm) in grants {
            match grant(&path, dir, uid, perm) {
                Ok(true) => {
                    info!(path = %path.display(), uid, "access granted to the plugin");
                    changed.push(path);
                }
                Ok(false) => {
                    debug!(path = %path.display(), "access already in place or path absent")
                }
                Err(err) => warn!("{err}"),
            }
        }
    }
    changed
}

/// Keeps the grants in place every `interval`, for ever.
pub async fn keep(targets: Vec<Target>, uid: u32, interval: Duration) {
    loop {
        let targets_now = targets.clone();
        let _ = tokio::task::spawn_blocking(move || ensure(&targets_now, uid)).await;
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests;
