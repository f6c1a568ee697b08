//! The one value that says where the host's file systems are.
//!
//! Every module that touches the host takes a [`HostPaths`] and builds its
//! paths from it; nothing in the logic names `/sys`, `/dev`, `/proc`, the
//! cgroup mount or kubelet's directory directly. Tests and `--host-root` point
//! every root into a fake tree.

use std::path::{Path, PathBuf};

/// Roots of the host file systems `amd-gpud` reads and writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPaths {
    /// sysfs mount (`/sys` on a host).
    pub sys: PathBuf,
    /// devtmpfs (`/dev`).
    pub dev: PathBuf,
    /// procfs (`/proc`).
    pub proc: PathBuf,
    /// cgroup v2 mount (`/sys/fs/cgroup`).
    pub cgroup: PathBuf,
    /// kubelet's state directory (`/var/lib/kubelet`).
    pub kubelet: PathBuf,
    /// Where generated CDI specs go (`/var/run/cdi`).
    pub cdi: PathBuf,
    /// amd-gpud's own state (`/var/lib/amd-gpud`, the unit's
    /// `StateDirectory=`).
    pub state: PathBuf,
    /// Runtime sockets (`/run`): containerd's is `<run>/containerd/containerd.sock`.
    pub run: PathBuf,
    /// Where the node's memory hook `libamvgpu.so` is installed
    /// (`/usr/local/vgpu`, the plugin's `--hook-path`).
    pub hook_dir: PathBuf,
    /// libdrm's `amdgpu.ids`, the first that exists: Debian's
    /// `libdrm-common` (`/usr/share/libdrm/amdgpu.ids`), then AMD's
    /// `libdrm-amdgpu-common` (`/opt/amdgpu/share/libdrm/amdgpu.ids`).
    pub amdgpu_ids: Vec<PathBuf>,
}

impl HostPaths {
    /// All roots under `root`: `root/sys`, `root/dev`, `root/proc`,
    /// `root/sys/fs/cgroup`, `root/var/lib/kubelet`. `HostPaths::under("/")`
    /// is the real host.
    pub fn under(root: impl AsRef<Path>) -> Self {
        let root = root.as_ref();
        let sys = root.join("sys");
        Self {
            cgroup: sys.join("fs").join("cgroup"),
            dev: root.join("dev"),
            proc: root.join("proc"),
            kubelet: root.join("var/lib/kubelet"),
            cdi: root.join("var/run/cdi"),
            state: root.join("var/lib/amd-gpud"),
            run: root.join("run"),
            hook_dir: root.join("usr/local/vgpu"),
            amdgpu_ids: vec![
                root.join("usr/share/libdrm/amdgpu.ids"),
                root.join("opt/amdgpu/share/libdrm/amdgpu.ids"),
            ],
            sys,
        }
    }

    /// KFD topology directory: `<sys>/class/kfd/kfd/topology`.
    pub fn kfd_topology(&self) -> PathBuf {
        self.sys.join("class/kfd/kfd/topology")
    }

    /// PCI device directory of `bdf` (`dddd:bb:dd.f`): `<sys>/bus/pci/devices/<bdf>`.
    pub fn pci_device(&self, bdf: &str) -> PathBuf {
        self.sys.join("bus/pci/devices").join(bdf)
    }

    /// KFD's per-process directory: `<sys>/class/kfd/kfd/proc`.
    pub fn kfd_proc(&self) -> PathBuf {
        self.sys.join("class/kfd/kfd/proc")
    }

    /// DRM class directory: `<sys>/class/drm`.
    pub fn drm_class(&self) -> PathBuf {
        self.sys.join("class/drm")
    }

    /// The kubelet's config file: `<kubelet>/config.yaml` (where kubeadm
    /// puts it).
    pub fn kubelet_config(&self) -> PathBuf {
        self.kubelet.join("config.yaml")
    }

    /// A device node under `<dev>`, e.g. `dri/renderD128` or `kfd`.
    pub fn dev_node(&self, name: &str) -> PathBuf {
        self.dev.join(name)
    }

    /// The KFD device: `<dev>/kfd`.
    pub fn kfd_device(&self) -> PathBuf {
        self.dev.join("kfd")
    }

    /// A DRM render node: `<dev>/dri/renderD<minor>`.
    pub fn render_node(&self, minor: u32) -> PathBuf {
        self.dev.join(format!("dri/renderD{minor}"))
    }

    /// A DRM card node: `<dev>/dri/card<minor>`.
    pub fn card_node(&self, minor: u32) -> PathBuf {
        self.dev.join(format!("dri/card{minor}"))
    }

    /// containerd's gRPC socket: `<run>/containerd/containerd.sock`.
    pub fn containerd_socket(&self) -> PathBuf {
        self.run.join("containerd/containerd.sock")
    }

    /// The memory hook: `<hook_dir>/libamvgpu.so`.
    pub fn memory_hook(&self) -> PathBuf {
        self.hook_dir.join("libamvgpu.so")
    }

    /// Where per-container copies of the hook are staged:
    /// `<state>/loader-hook`.
    pub fn staged_hooks(&self) -> PathBuf {
        self.state.join("loader-hook")
    }

    /// kubelet's directory of one pod: `<kubelet>/pods/<uid>`.
    pub fn kubelet_pod(&self, uid: &str) -> PathBuf {
        self.kubelet.join("pods").join(uid)
    }

    /// KFD topology node `index`: `<sys>/class/kfd/kfd/topology/nodes/<index>`.
    pub fn kfd_node(&self, index: u32) -> PathBuf {
        self.kfd_topology().join("nodes").join(index.to_string())
    }
}

impl Default for HostPaths {
    fn default() -> Self {
        Self::under("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_root_moves_under_the_host_root() {
        let p = HostPaths::under("/tmp/node");
        assert_eq!(p.sys, Path::new("/tmp/node/sys"));
        assert_eq!(p.dev, Path::new("/tmp/node/dev"));
        assert_eq!(p.proc, Path::new("/tmp/node/proc"));
        assert_eq!(p.cgroup, Path::new("/tmp/node/sys/fs/cgroup"));
        assert_eq!(
            p.kubelet_config(),
            Path::new("/tmp/node/var/lib/kubelet/config.yaml")
        );
        assert_eq!(
            p.kfd_topology(),
            Path::new("/tmp/node/sys/class/kfd/kfd/topology")
        );
        assert_eq!(
            p.render_node(128),
            Path::new("/tmp/node/dev/dri/renderD128")
        );
        assert_eq!(p.card_node(0), Path::new("/tmp/node/dev/dri/card0"));
        assert_eq!(p.kfd_device(), Path::new("/tmp/node/dev/kfd"));
        assert_eq!(
            p.containerd_socket(),
            Path::new("/tmp/node/run/containerd/containerd.sock")
        );
        assert_eq!(
            p.memory_hook(),
            Path::new("/tmp/node/usr/local/vgpu/libamvgpu.so")
        );
        assert_eq!(
            p.staged_hooks(),
            Path::new("/tmp/node/var/lib/amd-gpud/loader-hook")
        );
        assert_eq!(
            p.kfd_node(2),
            Path::new("/tmp/node/sys/class/kfd/kfd/topology/nodes/2")
        );
        assert_eq!(
            p.amdgpu_ids[0],
            Path::new("/tmp/node/usr/share/libdrm/amdgpu.ids")
        );
        assert_eq!(
            p.pci_device("0000:05:00.0"),
            Path::new("/tmp/node/sys/bus/pci/devices/0000:05:00.0")
        );
    }

    #[test]
    fn default_is_the_real_host() {
        assert_eq!(HostPaths::default().sys, Path::new("/sys"));
    }
}
