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
//! The hook is copied once, to `<root>/libamvgpu.so` (again when the
//! node's hook changes), and each container's directory gets a hard link
//! to that copy: a pod staging many containers costs directories and links,
//! not copies (issue 38, F6: 300 calls once left 1.5 GB of copies). The
//! mounts are read-only, so no container can change what the others run.
//! The number of containers' directories per pod ([`MAX_KEYS_PER_POD`]) and
//! of pods ([`MAX_PODS`]) is bounded.
//!
//! The directories of pods kubelet no longer has (no `<kubelet>/pods/<uid>`)
//! are removed at most once a minute, and before a new pod is refused for
//! want of room; the node-wide copy is not a pod's and stays.

use std::{
    fs, io,
    os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
    time::{Duration, Instant},
};

use crate::{
    dmem::uid::{PodUid, UidError, excerpt},
    hostpaths::HostPaths,
    state_file::{self, FileError},
};

/// The hook's file name, in the staged directory as on the host.
pub const HOOK_FILE: &str = "libamvgpu.so";

/// A staging key: 16 lowercase hex digits (the plugin's hash of the
/// container's device ids).
const KEY_LEN: usize = 16;

/// The largest hook copied (the real one is well under 10 MiB).
const MAX_HOOK_BYTES: u64 = 64 << 20;

/// At most this many containers' directories per pod. A key names one
/// container's set of device ids (containers with the same set share it),
/// so a pod needs at most one per container that asks for a GPU slice.
/// Kubernetes sets no number on a pod's containers, but a real pod has at
/// most a few hundred (init containers, sidecars and app containers, each a
/// process tree kubelet starts and probes); 256 covers them, and bounds one
/// pod to 256 directories and hard links.
pub(crate) const MAX_KEYS_PER_POD: usize = 256;

/// At most this many pods with staged directories. kubelet runs at most
/// `--max-pods` pods (110 by default; managed Kubernetes services cap it
/// at about 250) and only those with a GPU slice are staged; pods that are
/// gone are swept before one is refused. 512 covers the largest setting
/// twice over, and with [`MAX_KEYS_PER_POD`] bounds the node to 131,072
/// directories.
pub(crate) const MAX_PODS: usize = 512;

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
    #[error("the node's copy of the memory hook: {0}")]
    Copy(#[from] FileError),
    #[error(
        "pod {pod} already has {limit} containers' hook directories, the most staged per pod; refused"
    )]
    TooManyKeys { pod: String, limit: usize },
    #[error(
        "{limit} pods already have hook directories, the most staged per node; pod {pod} refused"
    )]
    TooManyPods { pod: String, limit: usize },
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
    /// Held while staging, so that the bounds are counted exactly.
    one_at_a_time: Mutex<()>,
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
            one_at_a_time: Mutex::new(()),
        }
    }

    /// Creates `<root>/<pod_uid>/<key>/` and puts the hook in it (a hard
    /// link to the node's copy; `with_hook`) or removes it from there;
    /// returns the directory.
    ///
    /// # Errors
    /// [`StageError`]: a malformed UID or key, a pod or key beyond the
    /// bounds, an unreadable hook, a directory that is not one, or a failed
    /// write.
    pub fn stage(&self, pod_uid: &str, key: &str, with_hook: bool) -> Result<PathBuf, StageError> {
        let uid = PodUid::parse(pod_uid)?;
        check_key(key)?;
        let _one = self
            .one_at_a_time
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let pod_dir = self.root.join(uid.as_str());
        let dir = pod_dir.join(key);
        plain_dir(&self.root)?;
        self.check_room(&uid, &pod_dir, &dir)?;
        for each in [&pod_dir, &dir] {
            plain_dir(each)?;
        }
        let staged = dir.join(HOOK_FILE);
        if with_hook {
            let copy = self.node_copy(false)?;
            let linked = match link(&copy, &dir, &staged) {
                // The copy has as many links as its file system allows.
                Err(err) if err.raw_os_error() == Some(libc::EMLINK) => {
                    link(&self.node_copy(true)?, &dir, &staged)
                }
                linked => linked,
            };
            linked.map_err(|err| io_error("linking", &staged, err))?;
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

    /// Refuses a new pod beyond [`MAX_PODS`] (after sweeping the gone ones)
    /// and a new key beyond [`MAX_KEYS_PER_POD`].
    fn check_room(&self, uid: &PodUid, pod_dir: &Path, dir: &Path) -> Result<(), StageError> {
        let is_pod = |name: &str| PodUid::parse(name).is_ok();
        if !present(pod_dir) {
            let full = || count(&self.root, MAX_PODS, is_pod).map(|n| n >= MAX_PODS);
            if full()? && (self.sweep_gone(uid) == 0 || full()?) {
                tracing::warn!(pod = %uid, limit = MAX_PODS, "too many pods staged");
                return Err(StageError::TooManyPods {
                    pod: uid.as_str().to_owned(),
                    limit: MAX_PODS,
                });
            }
        } else if !present(dir)
            && count(pod_dir, MAX_KEYS_PER_POD, |n| check_key(n).is_ok())? >= MAX_KEYS_PER_POD
        {
            tracing::warn!(pod = %uid, limit = MAX_KEYS_PER_POD, "too many keys staged");
            return Err(StageError::TooManyKeys {
                pod: uid.as_str().to_owned(),
                limit: MAX_KEYS_PER_POD,
            });
        }
        Ok(())
    }

    /// The node's copy of the hook, `<root>/libamvgpu.so`, copied again
    /// when the hook's size or modification time differ from it, or when
    /// `afresh`.
    fn node_copy(&self, afresh: bool) -> Result<PathBuf, StageError> {
        let copy = self.root.join(HOOK_FILE);
        let (mut source, meta) = self.open_hook()?;
        let current = fs::symlink_metadata(&copy).is_ok_and(|have| {
            have.file_type().is_file()
                && have.len() == meta.len()
                && have.modified().ok() == meta.modified().ok()
        });
        if current && !afresh {
            return Ok(copy);
        }
        let modified = meta.modified().ok();
        state_file::replace_with(&copy, 0o644, |file| {
            // The unit's UMask=0077 would leave 0600: containers of any
            // user read the hook.
            file.set_permissions(fs::Permissions::from_mode(0o644))?;
            let copied = io::copy(&mut io::Read::take(&mut source, MAX_HOOK_BYTES), file)?;
            if copied != meta.len() {
                return Err(io::Error::other(format!(
                    "copied {copied} of the hook's {} bytes (it changed meanwhile?)",
                    meta.len()
                )));
            }
            modified.map_or(Ok(()), |at| file.set_modified(at))
        })?;
        tracing::info!(copy = %copy.display(), bytes = meta.len(), "memory hook copied for staging");
        Ok(copy)
    }

    /// The hook, opened, if it is a regular file within [`MAX_HOOK_BYTES`].
    fn open_hook(&self) -> Result<(fs::File, fs::Metadata), StageError> {
        let hook_error = |why: String| StageError::Hook {
            path: self.hook.clone(),
            why,
        };
        let source = fs::File::open(&self.hook).map_err(|e| hook_error(e.to_string()))?;
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
        Ok((source, meta))
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
        self.sweep_gone(current);
    }

    /// Removes the directories of pods kubelet no longer has, but
    /// `current`'s; returns how many.
    fn sweep_gone(&self, current: &PodUid) -> usize {
        // A kubelet directory that is not there (another --root-dir?) says
        // nothing about which pods are gone.
        if !self.kubelet_pods.is_dir() {
            tracing::debug!(dir = %self.kubelet_pods.display(), "no kubelet pods directory; no sweep");
            return 0;
        }
        let removed = self.sweep(current);
        if removed > 0 {
            tracing::info!(removed, "removed the staged hooks of pods that are gone");
        }
        removed
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

/// Puts a hard link to `copy` at `staged` in `dir` (replacing what is
/// there), unless it is one already.
fn link(copy: &Path, dir: &Path, staged: &Path) -> io::Result<()> {
    let inode = |m: &fs::Metadata| (m.dev(), m.ino());
    let want = inode(&fs::symlink_metadata(copy)?);
    if fs::symlink_metadata(staged).is_ok_and(|have| inode(&have) == want) {
        return Ok(());
    }
    // Only root writes here, and link(2) follows no link at its new path.
    let partial = dir.join(format!(".{HOOK_FILE}.link"));
    let _ = fs::remove_file(&partial);
    let linked = fs::hard_link(copy, &partial).and_then(|()| fs::rename(&partial, staged));
    if linked.is_err() {
        let _ = fs::remove_file(&partial);
    }
    linked
}

/// Whether something is at `path` (not following a link).
fn present(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

/// How many entries of `dir` have a name `counted` accepts, counting no
/// further than `cap`; 0 when `dir` is absent.
fn count(dir: &Path, cap: usize, counted: impl Fn(&str) -> bool) -> Result<usize, StageError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(err) => return Err(io_error("listing", dir, err)),
    };
    Ok(entries
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_str().is_some_and(&counted))
        .take(cap)
        .count())
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
