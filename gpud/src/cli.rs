//! Command line of `amd-gpud`. Every flag has an environment twin (`GPUD_*`).

use std::{
    ffi::OsString,
    io::{self, Write},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};

use crate::{
    amdsmi::{self, AmdSmiConfig, LibrarySource},
    dbus::BusTarget,
    deadline,
    dmem::{self, DmemConfig, Driver},
    health::{HealthConfig, Params},
    hostpaths::HostPaths,
    inspect, inventory,
    restore_check::{self, Mode, Options, Request, Verdict, image},
    service::{Service, ServiceConfig},
};

/// Where AMD SMI is looked for when `--amdsmi auto`.
const DEFAULT_AMDSMI_DIRS: &[&str] = &["/opt/rocm/lib", "/opt/rocm/lib64"];

/// `amd-gpud`: device inventory and management of a node's AMD GPUs.
#[derive(Debug, Parser)]
#[command(name = "amd-gpud", version, about)]
pub struct Cli {
    /// Log filter (tracing EnvFilter syntax), e.g. `info` or `gpud=debug`.
    #[arg(long, env = "GPUD_LOG", default_value = "warn", global = true)]
    pub log: String,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the node's GPU inventory.
    Inspect(InspectArgs),
    /// Serve the inventory on D-Bus as io.hami.AmdGpu1 (run by systemd).
    Serve(ServeArgs),
    /// Say whether a CRIU checkpoint of a process using AMD GPUs could be
    /// restored on this node. Exits 0 when it would be, 1 when refused, 2 on
    /// an error.
    RestoreCheck(RestoreCheckArgs),
    /// Load AMD SMI and print what it reports as JSON (run by amd-gpud itself
    /// in a child process, so that a library that hangs or aborts cannot take
    /// the daemon down).
    #[command(hide = true)]
    AmdsmiProbe(amdsmi::ProbeArgs),
}

/// Options shared by everything that reads the host.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// Read the host under DIR (DIR/sys, DIR/dev, DIR/proc, DIR/var/lib/kubelet)
    /// instead of `/`.
    #[arg(long, env = "GPUD_HOST_ROOT", value_name = "DIR")]
    pub host_root: Option<PathBuf>,
    /// AMD SMI library: `auto` (search the ROCm directories and the loader
    /// path), `none` (sysfs only), or the path of a libamd_smi.so.
    #[arg(
        long,
        env = "GPUD_AMDSMI",
        default_value = "auto",
        value_name = "PATH|auto|none"
    )]
    pub amdsmi: String,
    /// Seconds the AMD SMI probe may take before it is killed.
    #[arg(
        long,
        env = "GPUD_AMDSMI_TIMEOUT",
        default_value_t = 30,
        value_name = "SECS"
    )]
    pub amdsmi_timeout: u64,
}

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub host: HostArgs,
    /// Print JSON (a stable contract for scripts) instead of a table.
    #[arg(long, env = "GPUD_JSON")]
    pub json: bool,
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub host: HostArgs,
    #[command(flatten)]
    pub loader: crate::loader_check::config::LoaderArgs,
    /// Bus address to connect to instead of the system bus (for tests).
    #[arg(long, env = "GPUD_BUS_ADDRESS", value_name = "ADDR")]
    pub bus_address: Option<String>,
    /// Seconds between re-reads of the inventory; 0 turns them off (an
    /// explicit Rescan call still works).
    #[arg(
        long,
        env = "GPUD_RESCAN_INTERVAL",
        default_value_t = 30,
        value_name = "SECS"
    )]
    pub rescan_interval: u64,
    /// UID of the device plugin's system user, allowed to call methods
    /// besides root.
    #[arg(long, env = "GPUD_PLUGIN_UID", default_value_t = ipc::PLUGIN_UID, value_name = "UID")]
    pub plugin_uid: u32,
    /// Keep giving the plugin's UID what it needs in kubelet's root-owned
    /// device-plugin and pod-resources directories (a POSIX ACL entry on
    /// each directory and `kubelet.sock`, checked again every few seconds so
    /// that a kubelet restart's new socket gets it too); `off` leaves them
    /// alone (a plugin running as root does not need it).
    #[arg(
        long,
        env = "GPUD_KUBELET_SOCKET_ACCESS",
        value_enum,
        default_value_t = Switch::On
    )]
    pub kubelet_socket_access: Switch,
    /// Write the CDI spec of the GPUs and partitions (`amd.com/gpu`) into
    /// the CDI directory (`/var/run/cdi`) whenever the inventory changes.
    #[arg(long, env = "GPUD_CDI", value_enum, default_value_t = Switch::On)]
    pub cdi: Switch,
    #[command(flatten)]
    pub dmem: DmemArgs,
    #[command(flatten)]
    pub health: HealthArgs,
}

/// Health checks of the GPUs and partitions (see `gpud::health`).
#[derive(Debug, clap::Args)]
pub struct HealthArgs {
    /// Seconds between two rounds of health probes (device nodes open, KFD
    /// node present, no fatal AMD SMI state); 0 turns health checks off.
    #[arg(
        long,
        env = "GPUD_HEALTH_PULSE",
        default_value_t = 10,
        value_name = "SECS"
    )]
    pub health_pulse: u64,
    /// Consecutive failed probes that take a device out of service.
    #[arg(
        long,
        env = "GPUD_UNHEALTHY_AFTER",
        default_value_t = 3,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub unhealthy_after: u32,
    /// Consecutive passed probes that bring a device back (unless flap
    /// damping holds it).
    #[arg(
        long,
        env = "GPUD_HEALTHY_AFTER",
        default_value_t = 2,
        value_name = "M",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub healthy_after: u32,
    /// Pulses in which the flap penalty of a device halves: how long an
    /// unsteady device is held out of service.
    #[arg(
        long,
        env = "GPUD_HEALTH_HALF_LIFE",
        default_value_t = 15,
        value_name = "PULSES",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub health_half_life: u32,
}

impl HealthArgs {
    pub fn config(&self) -> HealthConfig {
        HealthConfig {
            pulse: (self.health_pulse > 0).then(|| Duration::from_secs(self.health_pulse)),
            params: Params {
                unhealthy_after: self.unhealthy_after,
                healthy_after: self.healthy_after,
                half_life: self.health_half_life,
            },
        }
    }
}

/// An on/off switch (`--kubelet-socket-access`, `--cdi`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Switch {
    On,
    Off,
}

/// Hard VRAM caps through the dmem cgroup controller.
#[derive(Debug, clap::Args)]
pub struct DmemArgs {
    /// VRAM caps (SetPodVramLimits): `auto` turns them on when the node has
    /// everything (cgroup v2, the dmem controller, amdgpu regions, kubepods)
    /// and reports why not otherwise; `on` makes a missing part an error at
    /// start; `off` never touches cgroups.
    #[arg(
        long,
        env = "GPUD_DMEM_BACKEND",
        value_enum,
        default_value_t = BackendArg::Auto
    )]
    pub dmem_backend: BackendArg,
    /// kubelet's cgroup driver; `auto` reads `cgroupDriver` from
    /// /var/lib/kubelet/config.yaml, else looks for kubepods.slice (systemd)
    /// or kubepods (cgroupfs).
    #[arg(
        long,
        env = "GPUD_KUBELET_CGROUP_DRIVER",
        value_enum,
        default_value_t = DriverArg::Auto
    )]
    pub kubelet_cgroup_driver: DriverArg,
    /// kubelet's `cgroupRoot` (`--cgroup-root`), e.g. `/kubelet`; by default
    /// the kubelet config's, else `/`.
    #[arg(long, env = "GPUD_KUBELET_CGROUP_ROOT", value_name = "PATH")]
    pub kubelet_cgroup_root: Option<String>,
    /// Accept a cgroup mount that is not cgroup2 (a plain directory tree in
    /// tests). Never on a node.
    #[arg(long, env = "GPUD_DMEM_ANY_FS", hide = true)]
    pub dmem_any_fs: bool,
}

/// `--dmem-backend`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendArg {
    Auto,
    On,
    Off,
}

/// `--kubelet-cgroup-driver`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DriverArg {
    Auto,
    Systemd,
    Cgroupfs,
}

impl DmemArgs {
    pub fn config(&self) -> DmemConfig {
        DmemConfig {
            mode: match self.dmem_backend {
                BackendArg::Auto => dmem::Mode::Auto,
                BackendArg::On => dmem::Mode::On,
                BackendArg::Off => dmem::Mode::Off,
            },
            driver: match self.kubelet_cgroup_driver {
                DriverArg::Auto => None,
                DriverArg::Systemd => Some(Driver::Systemd),
                DriverArg::Cgroupfs => Some(Driver::Cgroupfs),
            },
            cgroup_root: self.kubelet_cgroup_root.clone(),
            require_cgroup2: !self.dmem_any_fs,
        }
    }
}

#[derive(Debug, clap::Args)]
pub struct RestoreCheckArgs {
    /// The CRIU image directory (or the unpacked kubelet checkpoint holding
    /// it in `checkpoint/`), or one `amdgpu-kfd-<id>.img`.
    #[arg(value_name = "IMAGE-DIR")]
    pub image: PathBuf,
    /// Read the host under DIR (DIR/sys) instead of `/`.
    #[arg(long, env = "GPUD_HOST_ROOT", value_name = "DIR")]
    pub host_root: Option<PathBuf>,
    /// The GPUs the restored container will see: KFD gpu_ids (decimal or
    /// 0x-hex), renderD<minor>, or PCI addresses (function 0: the whole
    /// GPU). Default: every GPU of the node.
    #[arg(
        long,
        env = "GPUD_RESTORE_GPUS",
        value_delimiter = ',',
        value_name = "ID,..."
    )]
    pub gpus: Vec<String>,
    /// A variable of CRIU's environment at restore, e.g. KFD_FW_VER_CHECK=0,
    /// read as CRIU reads it; repeat for more. The KFD_*_CHECK variables of
    /// this command's own environment count too, as they do for CRIU; --env
    /// wins over them.
    #[arg(
        long = "env",
        env = "GPUD_RESTORE_ENV",
        value_delimiter = ',',
        value_name = "KFD_X_CHECK=VALUE"
    )]
    pub env: Vec<String>,
    /// `explain`: whether any mapping passes CRIU's checks, with the mapping
    /// or what fails, and the mapping CRIU's search misses; `criu`: what
    /// CRIU 3.17.1's own search does (restorable, refused, would not finish,
    /// would crash).
    #[arg(
        long,
        env = "GPUD_RESTORE_MODE",
        default_value = "explain",
        value_parser = |s: &str| s.parse::<Mode>(),
        value_name = "explain|criu"
    )]
    pub mode: Mode,
    /// Print the verdict as JSON.
    #[arg(long, env = "GPUD_JSON")]
    pub json: bool,
}

impl HostArgs {
    pub fn host_paths(&self) -> HostPaths {
        self.host_root
            .as_ref()
            .map_or_else(HostPaths::default, HostPaths::under)
    }

    pub fn library_source(&self) -> LibrarySource {
        match self.amdsmi.as_str() {
            "none" | "off" => LibrarySource::Disabled,
            "auto" => LibrarySource::Search {
                dirs: DEFAULT_AMDSMI_DIRS.iter().map(PathBuf::from).collect(),
            },
            path => LibrarySource::Path(PathBuf::from(path)),
        }
    }

    /// The AMD SMI configuration; the probe child is this same executable.
    pub fn amdsmi_config(&self, helper: Vec<OsString>) -> AmdSmiConfig {
        AmdSmiConfig {
            library: self.library_source(),
            helper,
            timeout: Duration::from_secs(self.amdsmi_timeout),
            child_env: Vec::new(),
        }
    }
}

/// Entry point of the binary: parses `args`, runs, maps errors to an exit code.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli: Cli = match crate::command_line::parse(args) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    init_tracing(&cli.log);
    let helper = current_exe_helper();
    match run(cli, helper, &mut io::stdout().lock()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("amd-gpud: {}", ipc::report::one_line(err.as_ref()));
            ExitCode::FAILURE
        }
    }
}

/// Runs a parsed command, writing its output to `out`. `helper` is the
/// command line prefix that re-enters this program (for the AMD SMI probe).
///
/// # Errors
/// When the inventory cannot be read at all, or output cannot be written.
pub fn run(cli: Cli, helper: Vec<OsString>, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Inspect(args) => {
            let inventory = load_inventory(&args.host, helper)?;
            if args.json {
                // The table lists warnings itself; with JSON they go to the log too.
                inventory
                    .warnings
                    .iter()
                    .for_each(|w| tracing::warn!("{w}"));
                inspect::write_json(&inventory, out)?;
            } else {
                inspect::write_table(&inventory, out)?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(args) => {
            serve(args, helper)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::RestoreCheck(args) => Ok(restore_check_command(&args, out)),
        Command::AmdsmiProbe(args) => {
            let code = amdsmi::run_probe_command(&args, out);
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
        }
    }
}

/// Runs the D-Bus service until SIGTERM (or until the bus is lost: an error).
///
/// # Errors
/// When the service cannot start or loses the bus or its name.
pub fn serve(args: ServeArgs, helper: Vec<OsString>) -> anyhow::Result<()> {
    let paths = args.host.host_paths();
    let access =
        (args.kubelet_socket_access == Switch::On).then(|| crate::access::kubelet_targets(&paths));
    let exe = helper.first().map(std::path::PathBuf::from);
    let config = ServiceConfig {
        paths: paths.clone(),
        loader: args.loader.config(&paths, exe.as_deref()),
        amdsmi: args.host.amdsmi_config(helper),
        allowed_uids: vec![0, args.plugin_uid],
        dmem: args.dmem.config(),
        cdi: args.cdi == Switch::On,
        health: args.health.config(),
    };
    let bus = args
        .bus_address
        .map_or(BusTarget::System, BusTarget::Address);
    let rescan = (args.rescan_interval > 0).then(|| Duration::from_secs(args.rescan_interval));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let plugin_uid = args.plugin_uid;
    runtime
        .block_on(async move {
            if let Some(targets) = access {
                tokio::spawn(crate::access::keep(
                    targets,
                    plugin_uid,
                    Duration::from_secs(2),
                ));
            }
            crate::dbus::serve(Service::new(config), bus, rescan).await
        })
        .context("amd-gpud serve")
}

/// Runs `restore-check`: 0 restorable, 1 refused, 2 error (printed).
fn restore_check_command(args: &RestoreCheckArgs, out: &mut dyn Write) -> ExitCode {
    let written = restore_verdict(args).and_then(|verdict| {
        if args.json {
            verdict.write_json(out)?;
        } else {
            verdict.write_text(out)?;
        }
        Ok(verdict.restorable)
    });
    match written {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(err) => {
            eprintln!(
                "amd-gpud restore-check: {}",
                ipc::report::one_line(err.as_ref())
            );
            ExitCode::from(2)
        }
    }
}

#[tracing::instrument(skip_all, fields(image = %args.image.display(), mode = %args.mode))]
fn restore_verdict(args: &RestoreCheckArgs) -> anyhow::Result<Verdict> {
    // CRIU reads the KFD_*_CHECK variables from its own environment; so
    // does this command, and --env wins over them.
    let environment = std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)));
    let options = Options::from_environment_then(environment, &args.env)?;
    let path = image::find(&args.image)?;
    let image = image::read_file(&path)?;
    let paths = args
        .host_root
        .as_ref()
        .map_or_else(HostPaths::default, HostPaths::under);
    let request = Request {
        mode: args.mode,
        gpus: args.gpus.clone(),
        options,
    };
    Ok(restore_check::check_host(&paths, &image, &request)?)
}

/// Probes AMD SMI (when enabled) and reads the inventory.
///
/// # Errors
/// When the KFD topology cannot be read.
pub fn load_inventory(
    host: &HostArgs,
    helper: Vec<OsString>,
) -> anyhow::Result<inventory::Inventory> {
    inventory_with(&host.host_paths(), &host.amdsmi_config(helper))
}

/// Reads the inventory under `paths`, with AMD SMI as `config` says, within
/// [`deadline::SYSFS_READ`] plus the probe's timeout.
///
/// # Errors
/// When the KFD topology cannot be read, or the read misses its deadline.
pub fn inventory_with(
    paths: &HostPaths,
    config: &AmdSmiConfig,
) -> anyhow::Result<inventory::Inventory> {
    inventory_within(paths, config, deadline::SYSFS_READ)
}

/// [`inventory_with`], the sysfs part within `sysfs` instead.
pub(crate) fn inventory_within(
    paths: &HostPaths,
    config: &AmdSmiConfig,
    sysfs: Duration,
) -> anyhow::Result<inventory::Inventory> {
    let (paths, config) = (paths.clone(), config.clone());
    let probe = match config.library {
        LibrarySource::Disabled => Duration::ZERO,
        _ => config.timeout,
    };
    let limit = sysfs + probe;
    let context = format!("reading the GPU inventory under {}", paths.sys.display());
    let read = deadline::within("the read of the host tree", limit, move || {
        let (report, summary) = inventory::probe_amdsmi(&config);
        let inventory = inventory::discover(&paths, report.as_ref());
        inventory.map(|i| inventory::Inventory {
            amdsmi: summary,
            ..i
        })
    });
    read.context(context.clone())?.context(context)
}

fn current_exe_helper() -> Vec<OsString> {
    std::env::current_exe()
        .map(|p| vec![p.into_os_string()])
        .unwrap_or_else(|_| vec![OsString::from("amd-gpud")])
}

/// Logs to journald when systemd started us with the journal on stdout or
/// stderr (`JOURNAL_STREAM`), else to stderr.
fn init_tracing(filter: &str) {
    use tracing_subscriber::{layer::SubscriberExt, util::SubscriberInitExt};
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let registry = tracing_subscriber::registry().with(filter);
    let journald = std::env::var_os("JOURNAL_STREAM").and_then(|_| tracing_journald::layer().ok());
    let _ = match journald {
        Some(layer) => registry
            .with(layer.with_syslog_identifier("amd-gpud".into()))
            .try_init(),
        None => registry
            .with(tracing_subscriber::fmt::layer().with_writer(io::stderr))
            .try_init(),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve_args(extra: &[&str]) -> Result<ServeArgs, clap::Error> {
        let args = ["amd-gpud", "serve"].iter().chain(extra);
        match Cli::try_parse_from(args)?.command {
            Command::Serve(args) => Ok(args),
            other => panic!("not serve: {other:?}"),
        }
    }

    #[test]
    fn health_flags_and_defaults() {
        let config = serve_args(&[]).unwrap().health.config();
        assert_eq!(config, HealthConfig::default());
        let args = [
            "--health-pulse",
            "0",
            "--unhealthy-after",
            "5",
            "--healthy-after",
            "4",
            "--health-half-life",
            "30",
        ];
        let config = serve_args(&args).unwrap().health.config();
        assert_eq!(config.pulse, None, "0 turns the checks off");
        let p = config.params;
        assert_eq!(
            (p.unhealthy_after, p.healthy_after, p.half_life),
            (5, 4, 30)
        );
        let err = serve_args(&["--unhealthy-after", "0"]).unwrap_err();
        assert!(err.to_string().contains("unhealthy-after"), "{err}");
    }
}
