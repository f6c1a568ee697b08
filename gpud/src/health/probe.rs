//! The checks of one probe round: blocking file-system calls on paths the
//! service built from [`HostPaths`](crate::HostPaths), no locks held.

use std::{
    fs::OpenOptions,
    io,
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    time::Duration,
};

use tracing::debug;

/// One thing that must hold for a device to pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Check {
    /// A device node that must open (read-only, non-blocking, closed again
    /// at once): a DRM render or card node.
    Opens(PathBuf),
    /// A file that must exist but is not opened (`/dev/kfd`: opening it would
    /// create a KFD process for amd-gpud).
    Exists(PathBuf),
    /// A KFD topology node directory that must still be there, with this
    /// `gpu_id` when one was known.
    KfdNode { dir: PathBuf, gpu_id: Option<u64> },
    /// A fatal state the last AMD SMI probe reported for the device.
    AmdSmi(String),
}

/// What one probe of one device is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target<K> {
    pub key: K,
    pub checks: Vec<Check>,
}

/// Why a device failed its probe.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is gone: {source}")]
    Gone {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("KFD node {path} is gone")]
    KfdNodeGone { path: PathBuf },
    #[error("KFD node {path} has gpu_id {found:?}, not {expected}")]
    KfdNodeChanged {
        path: PathBuf,
        expected: u64,
        found: String,
    },
    #[error("AMD SMI reports {0}")]
    AmdSmi(String),
    #[error("the checks did not return within {0:?} (a hung device?)")]
    Hung(Duration),
}

/// Runs every target's checks in order; a target fails at its first failed
/// check.
pub fn run<K: Copy>(targets: &[Target<K>]) -> Vec<(K, Result<(), ProbeError>)> {
    targets
        .iter()
        .map(|t| (t.key, t.checks.iter().try_for_each(check)))
        .collect()
}

fn check(check: &Check) -> Result<(), ProbeError> {
    match check {
        Check::Opens(path) => opens(path),
        Check::Exists(path) => {
            std::fs::symlink_metadata(path)
                .map(drop)
                .map_err(|source| ProbeError::Gone {
                    path: path.clone(),
                    source,
                })
        }
        Check::KfdNode { dir, gpu_id } => kfd_node(dir, *gpu_id),
        Check::AmdSmi(state) => Err(ProbeError::AmdSmi(state.clone())),
    }
}

fn opens(path: &Path) -> Result<(), ProbeError> {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path);
    match opened {
        Ok(file) => {
            drop(file);
            Ok(())
        }
        Err(source) => {
            debug!(path = %path.display(), "health probe: {source}");
            Err(ProbeError::Open {
                path: path.to_path_buf(),
                source,
            })
        }
    }
}

fn kfd_node(dir: &Path, gpu_id: Option<u64>) -> Result<(), ProbeError> {
    let gone = || ProbeError::KfdNodeGone {
        path: dir.to_path_buf(),
    };
    let Some(expected) = gpu_id else {
        return if dir.is_dir() { Ok(()) } else { Err(gone()) };
    };
    let text = std::fs::read_to_string(dir.join("gpu_id")).map_err(|_| gone())?;
    match text.trim().parse::<u64>() {
        Ok(found) if found == expected => Ok(()),
        _ => Err(ProbeError::KfdNodeChanged {
            path: dir.to_path_buf(),
            expected,
            found: text.trim().chars().take(32).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_check_passes_and_fails_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let render = dir.path().join("renderD128");
        std::fs::write(&render, "").unwrap();
        let node = dir.path().join("nodes/2");
        std::fs::create_dir_all(&node).unwrap();
        std::fs::write(node.join("gpu_id"), "52527\n").unwrap();
        let good = Target {
            key: 1,
            checks: vec![
                Check::Opens(render.clone()),
                Check::Exists(render.clone()),
                Check::KfdNode {
                    dir: node.clone(),
                    gpu_id: Some(52527),
                },
                Check::KfdNode {
                    dir: node.clone(),
                    gpu_id: None,
                },
            ],
        };
        let changed = Target {
            key: 2,
            checks: vec![Check::KfdNode {
                dir: node.clone(),
                gpu_id: Some(1),
            }],
        };
        let smi = Target {
            key: 3,
            checks: vec![Check::AmdSmi("DRM_ERROR".into())],
        };
        let results = run(&[good.clone(), changed, smi]);
        assert!(results[0].1.is_ok());
        let err = results[1].1.as_ref().unwrap_err().to_string();
        assert!(err.contains("52527") && err.contains("nodes/2"), "{err}");
        assert!(matches!(results[2].1, Err(ProbeError::AmdSmi(_))));
        std::fs::remove_file(&render).unwrap();
        let err = run(&[good])[0].1.as_ref().unwrap_err().to_string();
        assert!(err.contains("renderD128"), "{err}");
        std::fs::remove_dir_all(dir.path().join("nodes")).unwrap();
        let gone = Check::KfdNode {
            dir: node,
            gpu_id: None,
        };
        assert!(matches!(check(&gone), Err(ProbeError::KfdNodeGone { .. })));
    }
}
