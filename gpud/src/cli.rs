//! Command line of `amd-gpud`. Every flag has an environment twin (`GPUD_*`).

use std::{
    ffi::OsString,
    io::{self, Write},
    path::PathBuf,
    process::ExitCode,
    time::Duration,
};

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::{
    amdsmi::{self, AmdSmiConfig, LibrarySource},
    hostpaths::HostPaths,
    inspect,
    inventory::{self, AmdSmiSummary},
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
    /// Load AMD SMI and print what it reports as JSON (run by amd-gpud itself
    /// in a child process, so that a library that hangs or aborts cannot take
    /// the daemon down).
    #[command(hide = true)]
    AmdsmiProbe(amdsmi::ProbeArgs),
}

/// Options shared by everything that reads the host.
#[derive(Debug, clap::Args)]
pub struct HostArgs {
    /// Read the host under DIR (DIR/sys, DIR/dev, DIR/proc) instead of `/`.
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
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) => {
            // Help and version are not errors; clap knows which is which.
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    init_tracing(&cli.log);
    let helper = current_exe_helper();
    match run(cli, helper, &mut io::stdout().lock()) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("amd-gpud: {err:#}");
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
        Command::AmdsmiProbe(args) => {
            let code = amdsmi::run_probe_command(&args, out);
            Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
        }
    }
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

/// Reads the inventory under `paths`, with AMD SMI as `config` says.
///
/// # Errors
/// When the KFD topology cannot be read.
pub fn inventory_with(
    paths: &HostPaths,
    config: &AmdSmiConfig,
) -> anyhow::Result<inventory::Inventory> {
    let (report, summary) = probe_amdsmi(config);
    let mut inventory = inventory::discover(paths, report.as_ref())
        .with_context(|| format!("reading the GPU inventory under {}", paths.sys.display()))?;
    inventory.amdsmi = summary;
    Ok(inventory)
}

fn probe_amdsmi(config: &AmdSmiConfig) -> (Option<amdsmi::report::AmdSmiReport>, AmdSmiSummary) {
    if matches!(config.library, LibrarySource::Disabled) {
        return (None, summary("disabled", "--amdsmi none".to_owned()));
    }
    match amdsmi::probe(config) {
        Ok(report) => {
            let v = &report.version;
            let detail = format!(
                "{} (version {}.{}.{}, layout {})",
                report.library, v.major, v.minor, v.release, report.layout
            );
            (Some(report), summary("loaded", detail))
        }
        Err(err) => {
            tracing::warn!("AMD SMI unavailable, inventory from sysfs only: {err}");
            (None, summary("unavailable", err.to_string()))
        }
    }
}

fn summary(state: &str, detail: String) -> AmdSmiSummary {
    AmdSmiSummary {
        state: state.to_owned(),
        detail,
    }
}

fn current_exe_helper() -> Vec<OsString> {
    std::env::current_exe()
        .map(|p| vec![p.into_os_string()])
        .unwrap_or_else(|_| vec![OsString::from("amd-gpud")])
}

fn init_tracing(filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .try_init();
}
