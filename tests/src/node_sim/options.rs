//! `node-sim`'s command line.

use std::path::PathBuf;

use clap::{Parser, ValueEnum};

use crate::hami_emulator::request::GpuPolicy;

/// The workspace's `examples/`, the default pods.
pub const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples");

/// The annotation with which an example pod asks for a node in a mode.
pub const MODE_ANNOTATION: &str = "node-sim/mode";

/// Run the node side of AMD GPU sharing on a fake node and show what HAMi
/// sees and what each pod gets.
#[derive(Debug, Clone, Parser)]
#[command(name = "node-sim", version, about)]
pub struct Options {
    /// The fake node: `mi300x-8` (MI300X ×8 in SPX), `mi300x-8-cpx`,
    /// `mi300x-8-dpx`, `mi355x-8`, `rx9070xt` (RX 9070 XT + iGPU), or any
    /// name `fake-node --list` shows. Default: `mi300x-8` for cu mode,
    /// `mi300x-8-cpx` for partition mode.
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// The plugin's operating mode: `cu` (GPUs shared by CU masks),
    /// `partition` (each compute partition a whole device), or `auto` (each
    /// pod in the mode its `node-sim/mode` annotation names, cu when none;
    /// one node per mode used).
    #[arg(long, value_enum, default_value_t = ModeArg::Auto)]
    pub mode: ModeArg,
    /// Pod manifests (YAML, `---` separates several): files, or directories
    /// whose `*.yaml` files are read in name order.
    #[arg(long, value_name = "PATH", num_args = 1.., default_value = EXAMPLES)]
    pub pods: Vec<PathBuf>,
    /// HAMi's `--gpu-scheduler-policy` for pods that name none.
    #[arg(long, value_enum, default_value_t = PolicyArg::Spread)]
    pub gpu_policy: PolicyArg,
    /// AMD SMI ABI the fake library mimics (6.2, 6.3, 6.4, 7.0, 7.13), or
    /// `none` for amd-gpud on sysfs alone.
    #[arg(long, default_value = "7.0", value_name = "ABI|none")]
    pub amdsmi: String,
    /// Which cluster the nodes join: `fake` (our fake API server and fake
    /// kubelet, in a second) or `real` (etcd, kube-apiserver,
    /// kube-scheduler and a real kubelet per node, built from the pinned
    /// Kubernetes modules on first use; needs root).
    #[arg(long, value_enum, default_value_t = ClusterArg::Fake, env = "NODE_SIM_CLUSTER")]
    pub cluster: ClusterArg,
    /// With `--cluster real`: a HAMi scheduler binary (`cmd/scheduler` of
    /// Project-HAMi/HAMi, built by the user; the project never builds or
    /// ships HAMi) that places the pods in place of the emulator, behind a
    /// kube-scheduler named `hami-scheduler` configured as HAMi's chart
    /// configures it.
    #[arg(long, value_name = "PATH", env = "HAMI_SCHEDULER")]
    pub hami_scheduler: Option<PathBuf>,
    /// The plugin answers Allocate with CDI device names (`--cdi true`)
    /// instead of device nodes.
    #[arg(long)]
    pub cdi: bool,
    /// Leave everything running after the report, with the fake API server's
    /// kubeconfig printed for kubectl, until Ctrl-C.
    #[arg(long)]
    pub keep_running: bool,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// Create (schedule) every pod before waiting for any admission: HAMi
    /// binds all of a node's pods (one holding the node lock at a time, as
    /// HAMi's Bind does) before kubelet admits them, so that races between
    /// binds and admissions can be replayed.
    #[arg(long, env = "NODE_SIM_ALL_AT_ONCE")]
    pub all_at_once: bool,
    /// No progress lines on stderr.
    #[arg(long, short)]
    pub quiet: bool,
}

/// `--cluster`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ClusterArg {
    Fake,
    Real,
}

/// `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ModeArg {
    Auto,
    Cu,
    Partition,
}

/// The plugin's operating mode of one simulated node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Cu,
    Partition,
}

impl Mode {
    /// As the plugin's `--operating-mode` spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cu => "cu",
            Self::Partition => "partition",
        }
    }

    /// The node used when `--node` is not given.
    pub fn default_node(self) -> &'static str {
        match self {
            Self::Cu => "mi300x-8-spx",
            Self::Partition => "mi300x-8-cpx",
        }
    }
}

/// `--gpu-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyArg {
    Spread,
    Binpack,
}

impl From<PolicyArg> for GpuPolicy {
    fn from(value: PolicyArg) -> Self {
        match value {
            PolicyArg::Spread => Self::Spread,
            PolicyArg::Binpack => Self::Binpack,
        }
    }
}

/// The builder fixture a `--node` value names (short aliases included).
pub fn fixture_name(node: &str) -> &str {
    match node {
        "mi300x-8" | "mi300x" => "mi300x-8-spx",
        "rx9070xt" | "radeon" => "rx9070xt-igpu",
        "mi355x" => "mi355x-8",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_aliases() {
        let o = Options::parse_from(["node-sim"]);
        assert_eq!(o.mode, ModeArg::Auto);
        assert_eq!(o.cluster, ClusterArg::Fake);
        assert_eq!(o.pods, [PathBuf::from(EXAMPLES)]);
        assert!(!o.json && !o.keep_running && !o.all_at_once);
        let o = Options::parse_from(["node-sim", "--pods", "a.yaml", "b", "--mode", "partition"]);
        assert_eq!(o.pods.len(), 2);
        assert_eq!(o.mode, ModeArg::Partition);
        assert_eq!(fixture_name("rx9070xt"), "rx9070xt-igpu");
        assert_eq!(fixture_name("mi300x-8-cpx"), "mi300x-8-cpx");
    }
}
