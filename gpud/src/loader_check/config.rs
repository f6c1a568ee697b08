//! `amd-gpud serve`'s flags of the loader check and where it reads from.

use std::{path::PathBuf, time::Duration};

use crate::hostpaths::HostPaths;

/// Where images and the memory hook are, for the loader check.
#[derive(Debug, clap::Args)]
pub struct LoaderArgs {
    /// containerd's gRPC socket, read for `InspectImage`; by default
    /// `/run/containerd/containerd.sock` under the host root.
    #[arg(long, env = "GPUD_CONTAINERD_SOCKET", value_name = "PATH")]
    pub containerd_socket: Option<PathBuf>,
    /// The containerd namespace kubelet's images are in.
    #[arg(long, env = "GPUD_CONTAINERD_NAMESPACE", default_value = "k8s.io")]
    pub containerd_namespace: String,
    /// The memory hook `StageMemoryHook` copies; by default
    /// `/usr/local/vgpu/libamvgpu.so` under the host root (the plugin's
    /// `--hook-path`).
    #[arg(long, env = "GPUD_MEMORY_HOOK", value_name = "PATH")]
    pub memory_hook: Option<PathBuf>,
    /// How long one image inspection may take, in seconds; its child is
    /// killed after that.
    #[arg(
        long,
        env = "GPUD_LOADER_CHECK_BUDGET",
        default_value_t = 600,
        value_name = "SECONDS"
    )]
    pub loader_check_budget: u64,
    /// Memory (heap) one inspector child may use, in MiB; an image that
    /// needs more is answered as failed.
    #[arg(
        long,
        env = "GPUD_LOADER_CHECK_MEMORY",
        default_value_t = 1024,
        value_name = "MIB"
    )]
    pub loader_check_memory: u64,
    /// The UID and GID inspector children run as (when amd-gpud is root):
    /// `amd-gpud-inspect` of the shipped sysusers file.
    #[arg(long, env = "GPUD_LOADER_CHECK_UID", default_value_t = crate::loader_check::sandbox::INSPECT_UID)]
    pub loader_check_uid: u32,
}

/// The loader check's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderConfig {
    pub containerd_socket: PathBuf,
    pub containerd_namespace: String,
    pub memory_hook: PathBuf,
    /// How long one inspection may take.
    pub budget: Duration,
    /// Bytes of heap one inspector child may use.
    pub inspector_memory: u64,
    /// The inspector children's UID and GID.
    pub inspector_uid: u32,
}

impl LoaderArgs {
    pub fn config(&self, paths: &HostPaths) -> LoaderConfig {
        LoaderConfig {
            containerd_socket: self
                .containerd_socket
                .clone()
                .unwrap_or_else(|| paths.containerd_socket()),
            containerd_namespace: self.containerd_namespace.clone(),
            memory_hook: self
                .memory_hook
                .clone()
                .unwrap_or_else(|| paths.memory_hook()),
            budget: Duration::from_secs(self.loader_check_budget),
            inspector_memory: self.loader_check_memory.saturating_mul(1 << 20),
            inspector_uid: self.loader_check_uid,
        }
    }
}
