//! Fake cgroup trees (plain directories under a temp dir), snapshots of
//! whole trees, and [`ControlFiles`] fakes that record, refuse or lie.

use std::{
    collections::BTreeMap,
    fs, io,
    os::fd::{AsRawFd, BorrowedFd},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use super::{
    Dmem, DmemConfig, Mode,
    beneath::{Beneath, ControlFiles, DMEM_MAX},
};
use crate::HostPaths;

pub const GPU0: &str = "0000:05:00.0";
pub const GPU1: &str = "0000:26:00.0";
pub const CAPACITY: u64 = 192 << 30;
pub const UID: &str = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
pub const UID_: &str = "0f1e2d3c_4b5a_6978_8796_a5b4c3d2e1f0";
pub const STATIC_UID: &str = "6f1e3a0e0c8b2d9f7a6b5c4d3e2f1a0b";
const CONTROLLERS: &str = "cpuset cpu io memory hugetlb pids rdma misc dmem\n";
const ENABLED: &str = "cpuset cpu io memory hugetlb pids rdma misc dmem\n";

/// The systemd driver's kubepods, QoS and default-root cgroups.
pub const SYSTEMD_DIRS: [&str; 3] = [
    "kubepods.slice",
    "kubepods.slice/kubepods-burstable.slice",
    "kubepods.slice/kubepods-besteffort.slice",
];
/// The cgroupfs driver's.
pub const CGROUPFS_DIRS: [&str; 3] = ["kubepods", "kubepods/burstable", "kubepods/besteffort"];

/// A host root whose cgroup mount is a plain directory tree.
pub struct FakeTree {
    pub tmp: tempfile::TempDir,
    pub paths: HostPaths,
}

/// One entry of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    Dir,
    File(String),
    Link(PathBuf),
}

impl FakeTree {
    /// A mount with dmem, two amdgpu regions and an xe one, a
    /// `system.slice` cgroup outside kubepods, and `dirs` (cgroups, relative
    /// to the mount, each with `dmem` in its `cgroup.subtree_control`).
    pub fn new(dirs: &[&str]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let paths = HostPaths::under(tmp.path());
        let tree = Self { tmp, paths };
        let mount = tree.mount();
        fs::create_dir_all(&mount).unwrap();
        fs::write(mount.join("cgroup.controllers"), CONTROLLERS).unwrap();
        fs::write(
            mount.join("dmem.capacity"),
            format!(
                "drm/{GPU0}/vram {CAPACITY}\ndrm/{GPU1}/vram {CAPACITY}\n\
                 drm/0000:00:02.0/vram0 4294967296\n"
            ),
        )
        .unwrap();
        fs::write(mount.join("dmem.current"), "").unwrap();
        tree.cgroup("");
        tree.cgroup("system.slice/victim.service");
        for dir in dirs {
            tree.cgroup(dir);
        }
        tree
    }

    /// `rel` as a cgroup with the usual files (`dmem` enabled for children).
    pub fn cgroup(&self, rel: &str) -> PathBuf {
        let dir = self.mount().join(rel);
        fs::create_dir_all(&dir).unwrap();
        fs::write(dir.join("cgroup.subtree_control"), ENABLED).unwrap();
        fs::write(dir.join("cgroup.procs"), "").unwrap();
        if !rel.is_empty() {
            fs::write(dir.join("memory.max"), "max\n").unwrap();
            fs::write(dir.join(DMEM_MAX), "").unwrap();
        }
        dir
    }

    /// A pod cgroup at `rel` (no children, so nothing enabled below it).
    pub fn pod(&self, rel: &str) -> PathBuf {
        let dir = self.cgroup(rel);
        fs::write(dir.join("cgroup.subtree_control"), "").unwrap();
        dir
    }

    pub fn mount(&self) -> PathBuf {
        self.paths.cgroup.clone()
    }

    /// The kubelet config file of this host root.
    pub fn kubelet_config(&self, text: &str) {
        let path = self.paths.kubelet_config();
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    pub fn config() -> DmemConfig {
        DmemConfig {
            mode: Mode::Auto,
            driver: None,
            cgroup_root: None,
            require_cgroup2: false,
        }
    }

    pub fn dmem(&self) -> Dmem {
        Dmem::new(self.paths.clone(), Self::config())
    }

    pub fn dmem_with(&self, config: DmemConfig, files: impl ControlFiles + 'static) -> Dmem {
        Dmem::with_files(self.paths.clone(), config, Box::new(files))
    }

    /// Every entry under the temp dir (the whole host root), symlinks not
    /// followed.
    pub fn snapshot(&self) -> BTreeMap<PathBuf, Node> {
        snapshot(self.tmp.path())
    }
}

pub fn snapshot(top: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    let mut stack = vec![top.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(top).unwrap().to_path_buf();
            let node = if meta.file_type().is_symlink() {
                Node::Link(fs::read_link(&path).unwrap())
            } else if meta.is_dir() {
                stack.push(path);
                Node::Dir
            } else {
                Node::File(fs::read_to_string(&path).unwrap())
            };
            out.insert(rel, node);
        }
    }
    out
}

/// Entries that differ: `(path, before, after)`.
pub fn diff(
    before: &BTreeMap<PathBuf, Node>,
    after: &BTreeMap<PathBuf, Node>,
) -> Vec<(PathBuf, Option<Node>, Option<Node>)> {
    let mut keys: Vec<&PathBuf> = before.keys().chain(after.keys()).collect();
    keys.sort();
    keys.dedup();
    keys.into_iter()
        .filter(|k| before.get(*k) != after.get(*k))
        .map(|k| ((*k).clone(), before.get(k).cloned(), after.get(k).cloned()))
        .collect()
}

/// The directory a handle refers to (through `/proc/self/fd`).
fn dir_path(dir: BorrowedFd<'_>) -> PathBuf {
    fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())).unwrap()
}

/// One write a [`Recording`] saw: the file (absolute) and the bytes.
pub type Write = (PathBuf, String);

/// Real file operations that also record every write attempt.
#[derive(Clone, Default)]
pub struct Recording {
    pub writes: Arc<Mutex<Vec<Write>>>,
}

impl ControlFiles for Recording {
    fn read(&self, dir: BorrowedFd<'_>, name: &str) -> io::Result<String> {
        Beneath.read(dir, name)
    }

    fn write(&self, dir: BorrowedFd<'_>, name: &str, bytes: &[u8]) -> io::Result<()> {
        let path = dir_path(dir).join(name);
        let text = String::from_utf8_lossy(bytes).into_owned();
        self.writes.lock().unwrap().push((path, text));
        Beneath.write(dir, name, bytes)
    }
}

/// Writes `dmem.max` for real but reads it back as `shown` (a kernel that
/// ignores a max below the current usage).
pub struct Lying {
    pub shown: String,
}

impl ControlFiles for Lying {
    fn read(&self, dir: BorrowedFd<'_>, name: &str) -> io::Result<String> {
        if name == DMEM_MAX {
            Ok(self.shown.clone())
        } else {
            Beneath.read(dir, name)
        }
    }

    fn write(&self, dir: BorrowedFd<'_>, name: &str, bytes: &[u8]) -> io::Result<()> {
        Beneath.write(dir, name, bytes)
    }
}

/// Refuses every write with `errno`, as the kernel does (EINVAL, EBUSY...).
pub struct Refusing {
    pub errno: i32,
}

impl ControlFiles for Refusing {
    fn read(&self, dir: BorrowedFd<'_>, name: &str) -> io::Result<String> {
        Beneath.read(dir, name)
    }

    fn write(&self, _: BorrowedFd<'_>, _: &str, _: &[u8]) -> io::Result<()> {
        Err(io::Error::from_raw_os_error(self.errno))
    }
}
