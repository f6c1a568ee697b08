//! Command line of `amd-device-plugin`. Every flag has an environment twin
//! (`AMDGPU_DP_*`, and `NODE_NAME` from the downward API).

use std::{net::SocketAddr, path::PathBuf, str::FromStr};

use clap::Parser;

use crate::{
    choice::InvalidChoice,
    inventory::{exclude::ExcludeGpus, partition::OperatingMode},
    kube::KubeAccess,
    preferred::Policy,
    sandbox::SandboxMode,
};

/// Default kubelet device-plugin directory.
pub(crate) const DEFAULT_KUBELET_DIR: &str = "/var/lib/kubelet/device-plugins";

/// `amd-device-plugin`: the kubelet device plugin for AMD GPUs under HAMi.
#[derive(Debug, Clone, Parser)]
#[command(name = "amd-device-plugin", version, about)]
pub(crate) struct Cli {
    /// Kubelet's device-plugin directory (holds kubelet.sock and our socket).
    #[arg(long, env = "AMDGPU_DP_KUBELET_DIR", default_value = DEFAULT_KUBELET_DIR, value_name = "DIR")]
    pub(crate) kubelet_dir: PathBuf,
    /// D-Bus address of the bus amd-gpud is on; the system bus when unset.
    #[arg(long, env = "AMDGPU_DP_BUS_ADDRESS", value_name = "ADDR")]
    pub(crate) bus_address: Option<String>,
    /// This node's name (from the downward API).
    #[arg(long, env = "NODE_NAME", value_name = "NAME", default_value = "")]
    pub(crate) node_name: String,
    /// Kubelet devices per GPU; 0 = per GPU: 2 on gfx12 and later, otherwise 10.
    #[arg(
        long,
        env = "AMDGPU_DP_SPLIT_COUNT",
        default_value_t = 0,
        value_name = "N"
    )]
    pub(crate) split_count: u32,
    /// How GetPreferredAllocation picks GPUs: `besteffort` (fewest, closest,
    /// fullest GPUs) or `spread` (farthest GPUs).
    #[arg(long, env = "AMDGPU_DP_ALLOCATOR_POLICY", default_value = "besteffort", value_parser = Policy::from_str)]
    pub(crate) allocator_policy: Policy,
    /// Kubernetes API access: `auto` (in-cluster config or KUBECONFIG), a
    /// kubeconfig PATH, or `none` (kubelet side only: Allocate is refused).
    #[arg(
        long,
        env = "AMDGPU_DP_KUBE",
        default_value = "auto",
        value_name = "none|auto|PATH"
    )]
    pub(crate) kube: KubeAccess,
    /// Seconds between checks that the node still carries the register
    /// annotation we want (it is rewritten only when it differs).
    #[arg(
        long,
        env = "AMDGPU_DP_REGISTER_INTERVAL",
        default_value_t = 60,
        value_name = "SECS"
    )]
    pub(crate) register_interval: u64,
    /// The host's /dev, as named in Allocate's device list.
    #[arg(
        long,
        env = "AMDGPU_DP_HOST_DEV",
        default_value = "/dev",
        value_name = "DIR"
    )]
    pub(crate) host_dev: PathBuf,
    /// Host directory holding the memory hook libamvgpu.so (mounted read-only
    /// into containers that get a slice).
    #[arg(
        long,
        env = "AMDGPU_DP_HOOK_PATH",
        default_value = "/usr/local/vgpu",
        value_name = "DIR"
    )]
    pub(crate) hook_path: PathBuf,
    /// Extended resource registered with kubelet.
    #[arg(long, env = "AMDGPU_DP_RESOURCE_NAME", default_value = "amd.com/gpu")]
    pub(crate) resource_name: String,
    /// File name of the plugin's socket in the kubelet directory.
    #[arg(
        long,
        env = "AMDGPU_DP_SOCKET_NAME",
        default_value = "amd.com_gpu.sock"
    )]
    pub(crate) socket_name: String,
    /// Hard VRAM caps through amd-gpud's dmem backend, set at
    /// PreStartContainer: `auto` (when amd-gpud reports the backend on; a cap
    /// that fails is logged and reported as an Event), `on` (required: a cap
    /// that fails fails the container start), `off`.
    #[arg(long, env = "AMDGPU_DP_DMEM_BACKEND", default_value = "auto", value_parser = DmemMode::from_str)]
    pub(crate) dmem_backend: DmemMode,
    /// Kubelet's pod-resources socket, to find the pod of a container after
    /// a plugin restart; `none` to not use it.
    #[arg(
        long,
        env = "AMDGPU_DP_POD_RESOURCES_SOCKET",
        default_value = proto::DEFAULT_POD_RESOURCES_SOCKET,
        value_name = "PATH|none"
    )]
    pub(crate) pod_resources_socket: String,
    /// `cu`: whole GPUs shared by CU masks; `partition`: each compute
    /// partition registered as a whole device. The node annotation
    /// `hami.io/amd-operating-mode` wins over this.
    #[arg(long, env = "OPERATING_MODE", default_value = "cu", value_parser = OperatingMode::from_str)]
    pub(crate) operating_mode: OperatingMode,
    /// Compute partition mode (`SPX`, `DPX`, `TPX`, `QPX`, `CPX`, in any
    /// case) every idle GPU that offers it is switched to at start, through
    /// amd-gpud; unset: none. The node annotation
    /// `hami.io/amd-compute-partition` wins over this.
    #[arg(long, env = "COMPUTE_PARTITION", value_name = "MODE", value_parser = crate::choice::compute_partition_flag)]
    pub(crate) compute_partition: Option<ipc::ComputeMode>,
    /// GPUs the node keeps for itself, as the Go plugin's `excludeGPUs`:
    /// PCI addresses (`0000:83:00.0`, `83:00.0`) or DRM cards (`card1`),
    /// comma- or space-separated. They and their partitions are neither
    /// offered to kubelet nor registered with HAMi.
    #[arg(long, env = "AMDGPU_DP_EXCLUDE_GPUS", default_value = "", value_parser = ExcludeGpus::from_str, value_name = "LIST")]
    pub(crate) exclude_gpus: ExcludeGpus,
    /// The landlock sandbox the plugin puts itself in after start-up:
    /// `best-effort` (what the kernel supports, logged), `required` (anything
    /// less than full enforcement is an error), `off`.
    #[arg(long, env = "AMDGPU_DP_SANDBOX", default_value = "best-effort", value_parser = SandboxMode::from_str)]
    pub(crate) sandbox: SandboxMode,
    /// Answer Allocate with CDI device names (`amd.com/gpu=<PCI address>`,
    /// from the spec amd-gpud writes) instead of device nodes; the container
    /// runtime must have CDI enabled.
    #[arg(long, env = "AMDGPU_DP_CDI", default_value_t = false, action = clap::ArgAction::Set, value_name = "true|false")]
    pub(crate) cdi: bool,
    /// Whether the cluster's admission lets only HAMi's scheduler and the
    /// plugin write HAMi's pod annotations (the chart's
    /// ValidatingAdmissionPolicy). Only then does a pod bound without a
    /// lock owner go by the oldest `hami.io/bind-time` when several could
    /// be it; otherwise that time is the pod author's to write, and such an
    /// Allocate is refused.
    #[arg(long, env = "AMDGPU_DP_ANNOTATIONS_PROTECTED", default_value_t = false, action = clap::ArgAction::Set, value_name = "true|false")]
    pub(crate) annotations_protected: bool,
    /// The loader check (the chart's `dp.muslFailClosed.enabled`;
    /// experimental): a slice's memory hook goes into a directory amd-gpud
    /// fills at PreStartContainer, once it has read the image's loader from
    /// containerd. glibc 2.34 or newer gets the hook; musl, static binaries
    /// and older glibc get none when amd-gpud's dmem backend caps the
    /// slice, and are refused otherwise; a loader that cannot be told is
    /// refused.
    #[arg(long, env = "AMDGPU_DP_LOADER_CHECK", default_value_t = false, action = clap::ArgAction::Set, value_name = "true|false")]
    pub(crate) loader_check: bool,
    /// Publish the healthy devices' memory (`amd.com/gpumem`, MiB) and compute
    /// units (`amd.com/gpucores`) as the node's capacity and allocatable, as
    /// the Go plugin's `-report_node_capacity` (chart `dp.reportNodeCapacity`)
    /// does; off by default, as there. Needs `patch` on `nodes/status`.
    #[arg(long, env = "AMDGPU_DP_REPORT_NODE_CAPACITY", default_value_t = false, action = clap::ArgAction::Set, value_name = "true|false")]
    pub(crate) report_node_capacity: bool,
    /// `LIBHIP_LOG_LEVEL` of the containers that load the memory hook (1
    /// error, 2 warn, 3 info, 4 debug), as the Go plugin's `hipLogLevel`; 0
    /// keeps the hook's own default.
    #[arg(long, env = "AMDGPU_DP_HIP_LOG_LEVEL", default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=4), value_name = "0-4")]
    pub(crate) hip_log_level: u8,
    /// Host directory under which amd-gpud stages each container's hook
    /// (its `<state>/loader-hook`), as Allocate names it in the mounts.
    #[arg(
        long,
        env = "AMDGPU_DP_LOADER_HOOK_ROOT",
        default_value = "/var/lib/amd-gpud/loader-hook",
        value_name = "DIR"
    )]
    pub(crate) loader_hook_root: PathBuf,
    /// Where to serve /metrics (Prometheus): `ADDRESS:PORT`, or `none`. It
    /// answers /healthz and /readyz too, for probes set up before
    /// `--probe-address`.
    #[arg(
        long,
        env = "AMDGPU_DP_METRICS_ADDRESS",
        default_value = DEFAULT_METRICS_ADDRESS,
        value_name = "ADDR:PORT|none",
        value_parser = ListenAddress::metrics
    )]
    pub(crate) metrics_address: ListenAddress,
    /// Where to serve /healthz and /readyz (the DaemonSet's probes) on a
    /// listener of their own, which peers filling the metrics port cannot
    /// reach: `ADDRESS:PORT`, or `none`.
    #[arg(
        long,
        env = "AMDGPU_DP_PROBE_ADDRESS",
        default_value = DEFAULT_PROBE_ADDRESS,
        value_name = "ADDR:PORT|none",
        value_parser = ListenAddress::probes
    )]
    pub(crate) probe_address: ListenAddress,
    /// Seconds between full re-reads of amd-gpud's inventory and health,
    /// besides its change signals (a missed signal costs at most one pulse);
    /// 0 turns these re-reads off, and health then follows amd-gpud's
    /// signals alone.
    #[arg(long, env = "AMDGPU_DP_HEALTH_PULSE", default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=3600), value_name = "SECS")]
    pub(crate) health_pulse: u64,
    /// Seconds amd-gpud may stay unreachable before the plugin says why, once,
    /// in its log and in a Warning Event on the Node (amd-gpud may simply
    /// start after the plugin).
    #[arg(long, env = "AMDGPU_DP_GPUD_UNREACHABLE_AFTER", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=3600), value_name = "SECS")]
    pub(crate) gpud_unreachable_after: u64,
    /// Log filter (tracing EnvFilter syntax).
    #[arg(long, env = "AMDGPU_DP_LOG", default_value = "info")]
    pub(crate) log: String,
}

/// Default `--metrics-address`: loopback, port 9394, HAMi's vGPU monitor's
/// (Project-HAMi/HAMi:cmd/vGPUmonitor/main.go; the chart's too), as the
/// HAMi series served there are its. Anyone who can reach the port can connect, so a plugin started by hand (or on a host network)
/// serves it to no one else until told; the chart binds every address of the
/// pod's own network namespace, behind its NetworkPolicy.
pub(crate) const DEFAULT_METRICS_ADDRESS: &str = "127.0.0.1:9394";

/// Default `--probe-address`: loopback like the metrics, port 9401 (the
/// chart's too): not the metrics port, 9394, HAMi's vGPU monitor's.
pub(crate) const DEFAULT_PROBE_ADDRESS: &str = "127.0.0.1:9401";

/// `--metrics-address` and `--probe-address`: where to listen, or not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListenAddress {
    None,
    At(SocketAddr),
}

impl ListenAddress {
    /// `--metrics-address`, or its environment twin.
    pub(crate) fn metrics(value: &str) -> Result<Self, InvalidChoice> {
        Self::parse(
            value,
            "--metrics-address (AMDGPU_DP_METRICS_ADDRESS)",
            "ADDRESS:PORT (e.g. 127.0.0.1:9394) or none",
        )
    }

    /// `--probe-address`, or its environment twin.
    pub(crate) fn probes(value: &str) -> Result<Self, InvalidChoice> {
        Self::parse(
            value,
            "--probe-address (AMDGPU_DP_PROBE_ADDRESS)",
            "ADDRESS:PORT (e.g. 127.0.0.1:9401) or none",
        )
    }

    fn parse(
        value: &str,
        what: &'static str,
        expected: &'static str,
    ) -> Result<Self, InvalidChoice> {
        if value == "none" {
            return Ok(Self::None);
        }
        value
            .parse()
            .map(Self::At)
            .map_err(|_| InvalidChoice::new(what, expected, value))
    }

    /// The port to listen on, if any.
    pub(crate) fn port(self) -> Option<u16> {
        match self {
            Self::At(address) => Some(address.port()),
            Self::None => None,
        }
    }
}

/// `--dmem-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DmemMode {
    Auto,
    On,
    Off,
}

impl FromStr for DmemMode {
    type Err = InvalidChoice;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        // `true` and `false` are the seed chart's spelling (`dp.dmemBackend`).
        match value {
            "auto" => Ok(Self::Auto),
            "on" | "true" => Ok(Self::On),
            "off" | "false" => Ok(Self::Off),
            other => Err(InvalidChoice::new(
                "--dmem-backend",
                "auto, on (or true) or off (or false)",
                other,
            )),
        }
    }
}

impl Cli {
    /// The pod-resources socket, unless turned off.
    pub(crate) fn pod_resources(&self) -> Option<PathBuf> {
        (self.pod_resources_socket != "none").then(|| PathBuf::from(&self.pod_resources_socket))
    }

    /// Full path of the plugin's socket.
    pub(crate) fn socket_path(&self) -> PathBuf {
        self.kubelet_dir.join(&self.socket_name)
    }

    /// Full path of kubelet's registration socket.
    pub(crate) fn kubelet_socket(&self) -> PathBuf {
        self.kubelet_dir.join(proto::KUBELET_SOCKET)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_values() {
        let cli = Cli::parse_from(["amd-device-plugin"]);
        assert_eq!(cli.kube, KubeAccess::Auto);
        assert_eq!(cli.split_count, 0);
        assert_eq!(cli.resource_name, "amd.com/gpu");
        assert_eq!(
            cli.socket_path(),
            PathBuf::from("/var/lib/kubelet/device-plugins/amd.com_gpu.sock")
        );
        let cli = Cli::parse_from([
            "x",
            "--kube",
            "none",
            "--allocator-policy",
            "spread",
            "--kubelet-dir",
            "/tmp/k",
        ]);
        assert_eq!(cli.kube, KubeAccess::None);
        assert_eq!(cli.allocator_policy, Policy::Spread);
        assert_eq!(cli.kubelet_socket(), PathBuf::from("/tmp/k/kubelet.sock"));
        let err = Cli::try_parse_from(["x", "--allocator-policy", "random"]).unwrap_err();
        assert!(err.to_string().contains("random"), "{err}");
        let cli = Cli::parse_from([
            "x",
            "--dmem-backend",
            "on",
            "--pod-resources-socket",
            "none",
        ]);
        assert_eq!(
            (cli.dmem_backend, cli.pod_resources()),
            (DmemMode::On, None)
        );
        for (value, mode) in [("true", DmemMode::On), ("false", DmemMode::Off)] {
            let cli = Cli::parse_from(["x", "--dmem-backend", value]);
            assert_eq!(cli.dmem_backend, mode, "the seed chart's {value}");
        }
        let cli = Cli::parse_from(["x", "--allocator-policy", "binpack"]);
        assert_eq!(
            cli.allocator_policy,
            Policy::BestEffort,
            "binpack is an alias"
        );
        assert_eq!(
            Cli::parse_from(["x", "--health-pulse", "0"]).health_pulse,
            0
        );
        let err = Cli::try_parse_from(["x", "--dmem-backend", "yes"]).unwrap_err();
        assert!(err.to_string().contains("\"yes\""), "{err}");
        assert_eq!(
            Cli::parse_from(["x"]).metrics_address,
            ListenAddress::At("127.0.0.1:9394".parse().unwrap()),
            "HAMi's vGPU monitor port"
        );
        let cli = Cli::parse_from(["x", "--metrics-address", "none"]);
        assert_eq!(cli.metrics_address, ListenAddress::None);
        let err = Cli::try_parse_from(["x", "--metrics-address", "9394"]).unwrap_err();
        assert!(err.to_string().contains("ADDRESS:PORT"), "{err}");
        assert!(
            err.to_string().contains(DEFAULT_METRICS_ADDRESS),
            "the example is the default: {err}"
        );
    }

    #[test]
    fn probe_address() {
        let probes = Cli::parse_from(["x"]).probe_address;
        assert_eq!(probes, ListenAddress::At("127.0.0.1:9401".parse().unwrap()));
        let metrics = ListenAddress::metrics(DEFAULT_METRICS_ADDRESS).unwrap();
        assert_ne!(probes.port(), metrics.port(), "the metrics port");
        assert_ne!(probes.port(), Some(9394), "HAMi's vGPU monitor port");
        let cli = Cli::parse_from(["x", "--probe-address", "none"]);
        assert_eq!(
            (cli.probe_address, cli.probe_address.port()),
            (ListenAddress::None, None)
        );
        let cli = Cli::parse_from(["x", "--probe-address", "[::1]:19401"]);
        assert_eq!(cli.probe_address.port(), Some(19401));
        let err = Cli::try_parse_from(["x", "--probe-address", "localhost"]).unwrap_err();
        let err = err.to_string();
        for part in [
            "\"localhost\"",
            "--probe-address",
            "AMDGPU_DP_PROBE_ADDRESS",
            DEFAULT_PROBE_ADDRESS,
        ] {
            assert!(err.contains(part), "{part} in {err}");
        }
        let command = <Cli as clap::CommandFactory>::command();
        let env = command
            .get_arguments()
            .find(|a| a.get_long() == Some("probe-address"))
            .and_then(clap::Arg::get_env);
        assert_eq!(env, Some(std::ffi::OsStr::new("AMDGPU_DP_PROBE_ADDRESS")));
    }

    #[test]
    fn hip_log_level() {
        assert_eq!(Cli::parse_from(["x"]).hip_log_level, 0);
        let cli = Cli::parse_from(["x", "--hip-log-level", "4"]);
        assert_eq!(cli.hip_log_level, 4);
        let err = Cli::try_parse_from(["x", "--hip-log-level", "5"]).unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("'5'") && err.contains("--hip-log-level"),
            "{err}"
        );
    }

    /// Off unless asked for, as the Go plugin's `-report_node_capacity`
    /// (chart `dp.reportNodeCapacity: false`); its env twin is the one the
    /// chart sets.
    #[test]
    fn report_node_capacity() {
        assert!(!Cli::parse_from(["x"]).report_node_capacity);
        let cli = Cli::parse_from(["x", "--report-node-capacity", "true"]);
        assert!(cli.report_node_capacity);
        let command = <Cli as clap::CommandFactory>::command();
        let env = command
            .get_arguments()
            .find(|a| a.get_long() == Some("report-node-capacity"))
            .and_then(clap::Arg::get_env);
        assert_eq!(
            env,
            Some(std::ffi::OsStr::new("AMDGPU_DP_REPORT_NODE_CAPACITY"))
        );
    }
}
