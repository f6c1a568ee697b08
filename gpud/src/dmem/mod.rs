//! Hard per-pod VRAM caps through the dmem cgroup controller
//! (torvalds/linux:Documentation/admin-guide/cgroup-v2.rst ("DMEM")).
//! Knows nothing of D-Bus.
//!
//! [`Dmem`] detects whether the backend is usable ([`detect`]), and
//! [`Dmem::set_pod_limits`] writes a pod's `dmem.max`: the pod UID and the
//! GPU addresses are validated first ([`uid`], [`region`]), the pod cgroup is
//! found from a fixed template under kubepods and opened beneath a held
//! handle of the cgroup mount without following symlinks ([`resolve`]), then
//! `+dmem` is enabled down the path where missing and each region written
//! and read back ([`write`]). Only `dmem.max` and `cgroup.subtree_control`
//! are ever opened for writing ([`beneath::WRITABLE`]). Calls are serialized;
//! [`cap_write`] runs one on a thread of its own within a deadline.

pub mod beneath;
pub(crate) mod cap_write;
pub mod detect;
pub mod kubelet;
pub mod layout;
pub mod region;
pub mod resolve;
pub mod uid;
pub mod write;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) mod testutil;

use std::{
    collections::BTreeMap,
    os::fd::{AsFd, OwnedFd},
    path::PathBuf,
    sync::{Mutex, MutexGuard, PoisonError},
};

pub use detect::{DetectError, Status};
pub use layout::{Driver, Qos};
use tracing::info;

use self::{
    beneath::{Beneath, ControlFiles},
    region::{Bdf, RegionError},
    resolve::ResolveError,
    uid::{PodUid, UidError},
    write::WriteError,
};
use crate::HostPaths;

/// Most limits one call may carry (GPUs per node are far fewer).
pub const MAX_LIMITS: usize = 64;

/// `--dmem-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// On when every part is there, else off with the reason.
    #[default]
    Auto,
    /// Every part must be there when the daemon starts.
    On,
    /// Never touch cgroups.
    Off,
}

/// How the backend is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DmemConfig {
    pub mode: Mode,
    /// `--kubelet-cgroup-driver`; `None` detects it.
    pub driver: Option<Driver>,
    /// `--kubelet-cgroup-root`; `None` takes the kubelet config's, else `/`.
    pub cgroup_root: Option<String>,
    /// Whether the cgroup mount must be cgroup2 (off only for fake trees).
    pub require_cgroup2: bool,
}

impl Default for DmemConfig {
    fn default() -> Self {
        Self {
            mode: Mode::Auto,
            driver: None,
            cgroup_root: None,
            require_cgroup2: true,
        }
    }
}

/// Why limits were not set.
#[derive(Debug, thiserror::Error)]
pub enum DmemError {
    #[error("the dmem backend is off: {reason}")]
    Off { reason: String },
    #[error(transparent)]
    Uid(#[from] UidError),
    #[error(transparent)]
    Address(#[from] RegionError),
    #[error("no limits given")]
    NoLimits,
    #[error("{count} limits given; at most {MAX_LIMITS}")]
    TooMany { count: usize },
    #[error("{bdf} has no VRAM region in dmem.capacity (known: {known:?})")]
    UnknownRegion { bdf: Bdf, known: Vec<String> },
    #[error("{bytes} bytes for {bdf} exceed its VRAM region ({capacity} bytes)")]
    TooLarge { bdf: Bdf, bytes: u64, capacity: u64 },
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// How a caller should see a [`DmemError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// The arguments (or a symlink planted in the tree) are refused.
    InvalidArgument,
    /// The backend is off.
    NotSupported,
    /// The pod cgroup does not exist (any more).
    NotFound,
    /// The kernel refused or did not apply a write; anything else.
    Failed,
}

impl DmemError {
    pub fn kind(&self) -> Kind {
        match self {
            Self::Off { .. } => Kind::NotSupported,
            Self::Uid(_)
            | Self::Address(_)
            | Self::NoLimits
            | Self::TooMany { .. }
            | Self::UnknownRegion { .. }
            | Self::TooLarge { .. }
            | Self::Resolve(ResolveError::Refused { .. })
            | Self::Write(WriteError::Symlink { .. }) => Kind::InvalidArgument,
            Self::Resolve(ResolveError::NotFound { .. }) | Self::Write(WriteError::Gone { .. }) => {
                Kind::NotFound
            }
            Self::Resolve(_) | Self::Write(_) => Kind::Failed,
        }
    }
}

/// What [`Dmem::set_pod_limits`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub qos: Qos,
    /// The pod cgroup, relative to the cgroup mount.
    pub cgroup: PathBuf,
    /// Its inode (the cgroup ID): a different one later is a new cgroup.
    pub inode: u64,
    pub outcome: write::Outcome,
}

struct State {
    /// The cgroup mount, held from the first successful open.
    mount: Option<OwnedFd>,
    status: Status,
}

/// The dmem backend: detection, status, and the writer.
pub struct Dmem {
    paths: HostPaths,
    config: DmemConfig,
    files: Box<dyn ControlFiles>,
    state: Mutex<State>,
    /// A copy of `state.status`, under a lock of its own that is never held
    /// across I/O: the D-Bus properties read it while a detection (which
    /// holds `state`) may be blocked on the cgroup tree.
    shown: Mutex<Status>,
}

impl std::fmt::Debug for Dmem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dmem")
            .field("config", &self.config)
            .field("status", &self.status())
            .finish_non_exhaustive()
    }
}

impl Dmem {
    /// Detects the backend under `paths` (blocking I/O).
    pub fn new(paths: HostPaths, config: DmemConfig) -> Self {
        Self::with_files(paths, config, Box::new(Beneath))
    }

    /// As [`Dmem::new`], with another implementation of the file operations.
    pub fn with_files(paths: HostPaths, config: DmemConfig, files: Box<dyn ControlFiles>) -> Self {
        let dmem = Self {
            paths,
            config,
            files,
            state: Mutex::new(State {
                mount: None,
                status: Status::default(),
            }),
            shown: Mutex::new(Status::default()),
        };
        dmem.refresh();
        dmem
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// What the last detection found.
    pub fn status(&self) -> Status {
        self.shown
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// With `--dmem-backend on`, the reason the backend is off, as an error.
    ///
    /// # Errors
    /// [`DmemError::Off`] when the mode is `on` and the backend is off.
    pub fn check_required(&self) -> Result<(), DmemError> {
        match (self.config.mode, self.status().off) {
            (Mode::On, Some(reason)) => Err(DmemError::Off { reason }),
            _ => Ok(()),
        }
    }

    /// Detects again; returns whether the status changed.
    pub fn refresh(&self) -> bool {
        let mut state = self.lock();
        let before = state.status.clone();
        let _ = self.detect(&mut state);
        state.status != before
    }

    fn detect(&self, state: &mut State) -> Result<detect::Backend, DetectError> {
        let mut status = Status::default();
        let result = self.detect_into(state, &mut status);
        if let Err(why) = &result {
            status.off = Some(why.to_string());
        }
        if status != state.status {
            info!(backend = %status.backend(), regions = status.regions.len(), "dmem backend");
        }
        state.status = status.clone();
        *self.shown.lock().unwrap_or_else(PoisonError::into_inner) = status;
        result
    }

    fn detect_into(
        &self,
        state: &mut State,
        status: &mut Status,
    ) -> Result<detect::Backend, DetectError> {
        if self.config.mode == Mode::Off {
            return Err(DetectError::Disabled);
        }
        let mount = match state.mount.take() {
            Some(fd) => fd,
            None => detect::open_mount(&self.paths.cgroup, self.config.require_cgroup2)?,
        };
        let mount = state.mount.insert(mount);
        detect::detect(
            self.files.as_ref(),
            mount.as_fd(),
            &self.paths,
            &self.config,
            status,
        )
    }

    /// Caps the VRAM of pod `uid`: for each GPU (PCI address) of `limits`,
    /// writes the byte count to the pod cgroup's `dmem.max` and verifies it.
    /// Detects the backend again first, so a kubelet that started late or a
    /// GPU that was rebound is seen. Idempotent.
    ///
    /// # Errors
    /// See [`DmemError`] and [`DmemError::kind`].
    pub fn set_pod_limits(
        &self,
        uid: &str,
        limits: &BTreeMap<String, u64>,
    ) -> Result<Applied, DmemError> {
        let uid = PodUid::parse(uid)?;
        let limits = parse_limits(limits)?;
        let mut state = self.lock();
        let backend = self.detect(&mut state).map_err(|why| DmemError::Off {
            reason: why.to_string(),
        })?;
        for (&bdf, &bytes) in &limits {
            let capacity = *backend
                .capacity
                .get(&bdf)
                .ok_or_else(|| DmemError::UnknownRegion {
                    bdf,
                    known: backend.capacity.keys().map(ToString::to_string).collect(),
                })?;
            if bytes > capacity {
                return Err(DmemError::TooLarge {
                    bdf,
                    bytes,
                    capacity,
                });
            }
        }
        let root = &self.paths.cgroup;
        let pod = resolve::find_pod(backend.mount.as_fd(), root, &backend.layout, &uid)?;
        let enabled = write::enable(self.files.as_ref(), root, &pod.ancestors)?;
        let mut outcome = write::apply(self.files.as_ref(), root, &pod, &limits)?;
        outcome.enabled = enabled;
        let inode = beneath::inode(pod.dir.fd.as_fd()).unwrap_or(0);
        info!(
            pod = %uid,
            qos = %pod.qos,
            cgroup = %root.join(&pod.dir.rel).display(),
            written = ?outcome.written.iter().map(|b| (b.to_string(), limits.get(b).copied().unwrap_or(0))).collect::<Vec<_>>(),
            unchanged = outcome.unchanged.len(),
            enabled = ?outcome.enabled,
            "VRAM limits set"
        );
        Ok(Applied {
            qos: pod.qos,
            cgroup: pod.dir.rel,
            inode,
            outcome,
        })
    }
}

/// The limits keyed by validated PCI address.
fn parse_limits(limits: &BTreeMap<String, u64>) -> Result<BTreeMap<Bdf, u64>, DmemError> {
    if limits.is_empty() {
        return Err(DmemError::NoLimits);
    }
    if limits.len() > MAX_LIMITS {
        return Err(DmemError::TooMany {
            count: limits.len(),
        });
    }
    limits
        .iter()
        .map(|(bdf, bytes)| Ok((Bdf::parse(bdf)?, *bytes)))
        .collect()
}
