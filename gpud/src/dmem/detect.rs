//! Is the dmem backend usable on this node? (The controller:
//! torvalds/linux:Documentation/admin-guide/cgroup-v2.rst, "DMEM"; kubelet's
//! cgroup layout: kubernetes/kubernetes:pkg/kubelet/cm/cgroup_manager_linux.go.)
//!
//! In order: the cgroup mount opens and is cgroup v2 (`CGROUP2_SUPER_MAGIC`);
//! `dmem` is in its `cgroup.controllers`; its root-only `dmem.capacity` has
//! at least one amdgpu `drm/<bdf>/vram` region; kubelet runs with per-QoS
//! cgroups; the cgroup driver is known (flag, else the kubelet config, else
//! which of `kubepods.slice`/`kubepods` exists); the kubepods cgroup opens
//! beneath the mount without symlinks. The first missing part is the reason
//! the backend is off.

use std::{
    collections::BTreeMap,
    io,
    os::fd::{AsFd, BorrowedFd, OwnedFd},
    path::{Path, PathBuf},
};

use super::{
    DmemConfig,
    beneath::{self, ControlFiles},
    kubelet::KubeletCgroups,
    layout::{Driver, Layout, LayoutError},
    region::{self, Bdf},
};
use crate::HostPaths;

/// `CGROUP2_SUPER_MAGIC` from `<linux/magic.h>`.
pub const CGROUP2_MAGIC: i128 = 0x6367_7270;
const CONTROLLERS: &str = "cgroup.controllers";
const CAPACITY: &str = "dmem.capacity";

/// Why the backend is off. Each names the file or value concerned.
#[derive(Debug, thiserror::Error)]
pub enum DetectError {
    #[error("disabled by --dmem-backend off")]
    Disabled,
    #[error("cannot open the cgroup mount {path}: {source}")]
    OpenRoot {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path} is not a cgroup v2 mount (file system magic {magic:#x}); only the unified hierarchy is supported"
    )]
    NotCgroup2 { path: PathBuf, magic: i128 },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "the dmem controller is not available: no `dmem` in {path} (needs Linux >= 6.15 with CONFIG_CGROUP_DMEM)"
    )]
    NoController { path: PathBuf },
    #[error("no amdgpu VRAM region (drm/<pci address>/vram) in {path}")]
    NoRegions { path: PathBuf },
    #[error(
        "{path} sets cgroupsPerQOS: false; without the kubepods hierarchy pods cannot be found"
    )]
    NoPerQos { path: PathBuf },
    #[error("{source} (from {origin})")]
    Layout {
        origin: String,
        #[source]
        source: LayoutError,
    },
    #[error(
        "cannot tell the kubelet cgroup driver: both {systemd} and {cgroupfs} exist; set --kubelet-cgroup-driver"
    )]
    Ambiguous { systemd: PathBuf, cgroupfs: PathBuf },
    #[error("no kubepods cgroup: neither {systemd} nor {cgroupfs} exists (is kubelet running?)")]
    NoKubepods { systemd: PathBuf, cgroupfs: PathBuf },
    #[error("cannot open the kubepods cgroup {path}: {source}")]
    Kubepods {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What detection found, also when it stopped early: what the node's
/// properties show.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// `None` when the backend is on, else why it is off.
    pub off: Option<String>,
    /// amdgpu VRAM regions of `dmem.capacity`: PCI address and bytes.
    pub regions: BTreeMap<String, u64>,
    pub driver: Option<Driver>,
    /// The kubepods cgroup, relative to the cgroup mount.
    pub kubepods: Option<PathBuf>,
}

impl Status {
    /// `on`, or `off: <reason>`.
    pub fn backend(&self) -> String {
        self.off
            .as_ref()
            .map_or_else(|| "on".to_owned(), |why| format!("off: {why}"))
    }
}

/// A usable backend: everything a write needs.
#[derive(Debug)]
pub struct Backend {
    /// The cgroup mount (a duplicate of the held handle).
    pub mount: OwnedFd,
    pub layout: Layout,
    pub capacity: BTreeMap<Bdf, u64>,
}

/// Opens the cgroup mount `path` and checks it is cgroup v2 (unless
/// `require_cgroup2` is off, for fake trees in tests).
///
/// # Errors
/// [`DetectError::OpenRoot`] or [`DetectError::NotCgroup2`].
pub fn open_mount(path: &Path, require_cgroup2: bool) -> Result<OwnedFd, DetectError> {
    let fd = beneath::open_root(path).map_err(|source| DetectError::OpenRoot {
        path: path.to_path_buf(),
        source,
    })?;
    if require_cgroup2 {
        let stat = rustix::fs::fstatfs(&fd).map_err(|e| DetectError::OpenRoot {
            path: path.to_path_buf(),
            source: e.into(),
        })?;
        let magic = i128::from(stat.f_type);
        if magic != CGROUP2_MAGIC {
            return Err(DetectError::NotCgroup2 {
                path: path.to_path_buf(),
                magic,
            });
        }
    }
    Ok(fd)
}

/// Runs every check on the open mount `root`, filling `status` as it goes.
///
/// # Errors
/// The first missing part, see [`DetectError`].
pub fn detect(
    files: &dyn ControlFiles,
    root: BorrowedFd<'_>,
    paths: &HostPaths,
    config: &DmemConfig,
    status: &mut Status,
) -> Result<Backend, DetectError> {
    let mount = &paths.cgroup;
    let read = |name: &str| {
        files.read(root, name).map_err(|source| DetectError::Read {
            path: mount.join(name),
            source,
        })
    };
    let controllers = read(CONTROLLERS)?;
    if !controllers.split_whitespace().any(|c| c == "dmem") {
        return Err(DetectError::NoController {
            path: mount.join(CONTROLLERS),
        });
    }
    let capacity = region::amdgpu_capacity(&read(CAPACITY)?);
    status.regions = capacity.iter().map(|(b, n)| (b.to_string(), *n)).collect();
    if capacity.is_empty() {
        return Err(DetectError::NoRegions {
            path: mount.join(CAPACITY),
        });
    }
    let layout = kubelet_layout(root, paths, config)?;
    status.driver = Some(layout.driver());
    let kubepods = layout.kubepods();
    status.kubepods = Some(kubepods.clone());
    beneath::open_dir(root, &kubepods).map_err(|source| DetectError::Kubepods {
        path: mount.join(&kubepods),
        source,
    })?;
    let dup = root
        .try_clone_to_owned()
        .map_err(|source| DetectError::OpenRoot {
            path: mount.clone(),
            source,
        })?;
    Ok(Backend {
        mount: dup,
        layout,
        capacity,
    })
}

/// The pod cgroup layout: flags first, then the kubelet config, then the tree.
fn kubelet_layout(
    root: BorrowedFd<'_>,
    paths: &HostPaths,
    config: &DmemConfig,
) -> Result<Layout, DetectError> {
    let config_path = paths.kubelet_config();
    let kubelet = KubeletCgroups::read(&config_path).map_err(|source| DetectError::Read {
        path: config_path.clone(),
        source,
    })?;
    if kubelet.per_qos == Some(false) {
        return Err(DetectError::NoPerQos { path: config_path });
    }
    let (cgroup_root, root_origin) = match (&config.cgroup_root, &kubelet.root) {
        (Some(flag), _) => (flag.clone(), "--kubelet-cgroup-root".to_owned()),
        (None, Some(file)) => (file.clone(), config_path.display().to_string()),
        (None, None) => ("/".to_owned(), "the default".to_owned()),
    };
    let layout_err = |origin: String| move |source| DetectError::Layout { origin, source };
    let driver = match (config.driver, &kubelet.driver) {
        (Some(driver), _) => driver,
        (None, Some(file)) => file
            .parse()
            .map_err(layout_err(config_path.display().to_string()))?,
        (None, None) => {
            driver_from_tree(root, &paths.cgroup, &cgroup_root).map_err(|e| match e {
                Guess::Layout(source) => DetectError::Layout {
                    origin: root_origin.clone(),
                    source,
                },
                Guess::Detect(d) => d,
            })?
        }
    };
    Layout::new(driver, &cgroup_root).map_err(layout_err(root_origin))
}

enum Guess {
    Layout(LayoutError),
    Detect(DetectError),
}

/// The driver whose kubepods cgroup exists; both or neither is an error.
fn driver_from_tree(
    root: BorrowedFd<'_>,
    mount: &Path,
    cgroup_root: &str,
) -> Result<Driver, Guess> {
    let systemd = Layout::new(Driver::Systemd, cgroup_root)
        .map_err(Guess::Layout)?
        .kubepods();
    let cgroupfs = Layout::new(Driver::Cgroupfs, cgroup_root)
        .map_err(Guess::Layout)?
        .kubepods();
    // Anything but "not there" counts as there, so that a planted symlink
    // surfaces as a refusal to open kubepods rather than a silent guess.
    let exists = |rel: &Path| match beneath::open_dir(root.as_fd(), rel) {
        Ok(_) => true,
        Err(e) => !matches!(e.kind(), io::ErrorKind::NotFound),
    };
    match (exists(&systemd), exists(&cgroupfs)) {
        (true, false) => Ok(Driver::Systemd),
        (false, true) => Ok(Driver::Cgroupfs),
        (true, true) => Err(Guess::Detect(DetectError::Ambiguous {
            systemd: mount.join(systemd),
            cgroupfs: mount.join(cgroupfs),
        })),
        (false, false) => Err(Guess::Detect(DetectError::NoKubepods {
            systemd: mount.join(systemd),
            cgroupfs: mount.join(cgroupfs),
        })),
    }
}
