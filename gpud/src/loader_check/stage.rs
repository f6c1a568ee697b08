//! Per-container copies of the memory hook (docs/loader-check.md).
//!
//! With the loader check on, Allocate mounts `<root>/<pod uid>/<key>/` (a
//! directory) where the hook would go, and names `libamvgpu.so` in it in
//! `LD_AUDIT`. At PreStartContainer, once the image is on the node and has
//! been inspected, the plugin asks amd-gpud to put the hook there or to
//! leave the directory empty. An `LD_AUDIT` library that does not exist is
//! skipped by glibc's loader with a message, so an empty directory means
//! "no hook" and the container still starts. The directory is created here
//! in every case, because kubelet's CreateContainer fails on a bind mount
//! whose source is missing.
//!
//! The directories of pods kubelet no longer has (no `<kubelet>/pods/<uid>`)
//! are removed at most once a minute.

use std::{
    fs, io,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::Mutex,
    time::{Duration, Instant},
};

use crate::{
    dmem::uid::{PodUid, UidError, excerpt},
    hostpaths::HostPaths,
};

/// The hook's file name, in the staged directory as on the host.
pub const HOOK_FILE: &str = "libamvgpu.so";

/// A staging key: 16 lowercase hex digits (the plugin's hash of the
/// container's device ids).
const KEY_LEN: usize = 16;

/// The largest hook copied (the real one is well under 10 MiB).
const MAX_HOOK_BYTES: u64 = 64 << 20;

/// At most this many pod directories are looked at per sweep.
const MAX_SWEPT: usize = 100_000;

/// How often the directories of gone pods are looked for.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Why a hook could not be staged.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("pod UID: {0}")]
    Uid(#[from] UidError),
    #[error("staging key {excerpt}: expected {KEY_LEN} lowercase hex digits")]
    Key { excerpt: String },
    #[error("the memory hook {path} cannot be used: {why}")]
    Hook { path: PathBuf, why: String },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not a plain directory (a symlink?); staging refused")]
    NotADirectory { path: PathBuf },
}

impl StageError {
    /// Whether the caller's arguments were at fault.
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Self::Uid(_) | Self::Key { .. })
    }
}

/// Stages hooks under `<state>/loader-hook`.
#[derive(Debug)]
pub struct HookStage {
    root: PathBuf,
    hook: PathBuf,
    kubelet_pods: PathBuf,
    last_sweep: Mutex<Option<Instant>>,
}

impl HookStage {
    /// Stages under `paths.staged_hooks()` from `hook` (default
    /// `paths.memory_hook()`).
    pub fn new(paths: &HostPaths, hook: Option<PathBuf>) -> Self {
        Self {
            root: paths.staged_hooks(),
            hook: hook.unwrap_or_else(|| paths.memory_hook()),
            kubelet_pods: paths.kubelet.join("pods"),
            last_sweep: Mutex::new(None),
        }
    }

    /// Creates `<root>/<pod_uid>/<key>/` and puts a copy of the hook in it
    /// (`with_hook`) or removes the copy there; returns the directory.
    ///
    /// # Errors
    /// [`StageError`]: a malformed UID or key, an unreadable hook, a
    /// directory that is not one, or a failed write.
    pub fn stage(&self, pod_uid: &str, key: &str, with_hook: bool) -> Result<PathBuf, StageError> {
        let uid = PodUid::parse(pod_uid)?;
        check_key(key)?;
        let pod_dir = self.root.join(uid.as_str());
        let dir = pod_dir.join(key);
        for each in [&self.root, &pod_dir, &dir] {
            plain_dir(each)?;
        }
        let staged = dir.join(HOOK_FILE);
        if with_hook {
            self.copy_hook(&dir, &staged)?;
        } else {
            match fs::remove_file(&staged) {
                Err(err) if err.kind() != io::ErrorKind::NotFound => {
                    return Err(io_error("removing", &staged, err));
                }
                _ => {}
            }
        }
        self.sweep_if_due(&uid);
        Ok(dir)
    }

    /// Copies the hook next to `staged` and renames it into place, so a
    /// container never sees half a file.
    fn copy_hook(&self, dir: &Path, staged: &Path) -> Result<(), StageError> {
        let hook_error = |why: String| StageError::Hook {
            path: self.hook.clone(),
            why,
        };
        let mut source = fs::File::open(&self.hook).map_err(|e| hook_error(e.to_string()))?;
        let meta = source.metadata().map_err(|e| hook_error(e.to_string()))?;
        if !meta.is_file() {
            return Err(hook_error("not a regular file".into()));
        }
        if meta.len() > MAX_HOOK_BYTES {
            return Err(hook_error(format!(
                "{} bytes, more than the {MAX_HOOK_BYTES} copied",
                meta.len()
            )));
        }
        let partial = dir.join(format!(".{HOOK_FILE}.{}.partial", std::process::id()));
        let _ = fs::remove_file(&partial);
        let mut copy = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&partial)
            .map_err(|e| io_error("creating", &partial, e))?;
        let copied = copy
            .set_permissions(fs::Permissions::from_mode(0o644))
            .and_then(|()| io::copy(&mut io::Read::take(&mut source, MAX_HOOK_BYTES), &mut copy))
            .and_then(|_| copy.sync_all())
            .and_then(|()| fs::rename(&partial, staged));
        if let Err(err) = copied {
            let _ = fs::remove_file(&partial);
            return Err(io_error("writing", staged, err));
        }
        Ok(())
    }

    /// Removes the directories of pods kubelet no longer has, at most once
    /// per [`SWEEP_EVERY`]; never `current`'s. Failures are logged only.
    fn sweep_if_due(&self, current: &PodUid) {
        let now = Instant::now();
        {
            let mut last = self
                .last_sweep
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if last.is_some_and(|at| now.duration_since(at) < SWEEP_EVERY) {
                return;
            }
            *last = Some(now);
        }
        // A kubelet directory that is not there (another --root-dir?) says
        // nothing about which pods are gone.
        if !self.kubelet_pods.is_dir() {
            tracing::debug!(dir = %self.kubelet_pods.display(), "no kubelet pods directory; no sweep");
            return;
        }
        let removed = self.sweep(current);
        if removed > 0 {
            tracing::info!(removed, "removed the staged hooks of pods that are gone");
        }
    }

    fn sweep(&self, current: &PodUid) -> usize {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return 0;
        };
        let mut removed = 0;
        for entry in entries.take(MAX_SWEPT).flatten() {
            let name = entry.file_name();
            let Some(uid) = name.to_str().and_then(|n| PodUid::parse(n).ok()) else {
                continue;
            };
            if &uid == current || self.kubelet_pods.join(uid.as_str()).exists() {
                continue;
            }
            match fs::remove_dir_all(entry.path()) {
                Ok(()) => removed += 1,
                Err(err) => tracing::warn!(pod = %uid, "cannot remove a staged hook: {err}"),
            }
        }
        removed
    }
}

fn check_key(key: &str) -> Result<(), StageError> {
    let hex = |b: u8| b.is_ascii_digit() || (b'a'..=b'f').contains(&b);
    if key.len() == KEY_LEN && key.bytes().all(hex) {
        Ok(())
    } else {
        Err(StageError::Key {
            excerpt: excerpt(key),
        })
    }
}

/// Creates `path` (mode 0755) unless it exists; refuses anything there that
/// is not a plain directory.
fn plain_dir(path: &Path) -> Result<(), StageError> {
    // The unit's UMask=0077 would leave 0700: containers of any user read
    // what is mounted from here, so the mode is set explicitly.
    let open = || fs::Permissions::from_mode(0o755);
    match fs::DirBuilder::new().mode(0o755).create(path) {
        Ok(()) => {
            return fs::set_permissions(path, open()).map_err(|e| io_error("opening", path, e));
        }
        Err(err) if err.kind() != io::ErrorKind::AlreadyExists => {
            return Err(io_error("creating", path, err));
        }
        Err(_) => {}
    }
    let meta = fs::symlink_metadata(path).map_err(|e| io_error("reading", path, e))?;
    if !meta.file_type().is_dir() {
        return Err(StageError::NotADirectory {
            path: path.to_owned(),
        });
    }
    if meta.permissions().mode() & 0o022 != 0 {
        // Nobody but root may put files into what containers mount.
        fs::set_permissions(path, open()).map_err(|e| io_error("restricting", path, e))?;
    }
    Ok(())
}

fn io_error(what: &'static str, path: &Path, source: io::Error) -> StageError {
    StageError::Io {
        what,
        path: path.to_owned(),
        source,
    }
}

#[cfg(test)]
mod tests;
