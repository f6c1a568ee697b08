//! `amd-gpud serve`'s flags of the loader check and where it reads from.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    time::Duration,
};

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
    /// The program that reads images from containerd and parses them, one
    /// process per inspection (it holds the containerd client and the image
    /// parsers, which amd-gpud does not); by default
    /// `amd-gpud-loader-check` next to amd-gpud's own executable.
    #[arg(long, env = "GPUD_LOADER_CHECK_HELPER", value_name = "PATH")]
    pub loader_check_helper: Option<PathBuf>,
}

/// The helper binary's name, next to `amd-gpud` (`/usr/bin` when packaged).
pub const HELPER_NAME: &str = "amd-gpud-loader-check";

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
    /// The helper binary (program and leading arguments).
    pub helper: Vec<OsString>,
}

impl LoaderArgs {
    /// The configuration; `exe`: amd-gpud's own executable, next to which
    /// the helper is by default.
    pub fn config(&self, paths: &HostPaths, exe: Option<&Path>) -> LoaderConfig {
        let helper = self.loader_check_helper.clone().unwrap_or_else(|| {
            exe.and_then(Path::parent)
                .map_or_else(|| PathBuf::from(HELPER_NAME), |dir| dir.join(HELPER_NAME))
        });
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
            helper: vec![helper.into_os_string()],
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use clap::Parser;

    use super::{HELPER_NAME, LoaderArgs};
    use crate::hostpaths::HostPaths;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        loader: LoaderArgs,
    }

    fn helper_of(args: &[&str], exe: Option<&Path>) -> Vec<std::ffi::OsString> {
        let flags =
            Flags::try_parse_from(std::iter::once("amd-gpud").chain(args.iter().copied())).unwrap();
        flags.loader.config(&HostPaths::default(), exe).helper
    }

    #[test]
    fn the_helper_is_next_to_amd_gpud_unless_named() {
        let exe = Path::new("/usr/bin/amd-gpud");
        assert_eq!(
            helper_of(&[], Some(exe)),
            vec![std::ffi::OsString::from("/usr/bin/amd-gpud-loader-check")]
        );
        assert_eq!(
            helper_of(&["--loader-check-helper", "/opt/x/helper"], Some(exe)),
            vec![std::ffi::OsString::from("/opt/x/helper")]
        );
        // No executable known: looked for on PATH by its name.
        assert_eq!(
            helper_of(&[], None),
            vec![std::ffi::OsString::from(HELPER_NAME)]
        );
    }
}
