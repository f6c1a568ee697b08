//! `amd-gpud serve`'s flags of the loader check and where it reads from.

use std::path::PathBuf;

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
}

/// The loader check's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoaderConfig {
    pub containerd_socket: PathBuf,
    pub containerd_namespace: String,
    pub memory_hook: PathBuf,
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
        }
    }
}
