//! AMD SMI (`libamd_smi.so`) loader.
//!
//! The library can hang or abort (docs/amd-hardware.md §12.6), so it is only ever loaded in a
//! child process: [`probe`] (parent side) runs `helper... amdsmi-probe <args>`, enforces a
//! timeout and decodes the one JSON document the child prints; [`run_probe_command`] (child
//! side, the hidden `amdsmi-probe` subcommand) loads the library, detects its ABI, probes every
//! GPU processor and prints that document.
//!
//! Module map: `dynlib` (the only `unsafe`: symbols and calls), `layout` (version detection,
//! BDF, byte readers), `decode` (struct decoders by offset), `status` (status names),
//! `locate` (finding the library file), `child` (the probe itself), `usage` (the light
//! `--usage` probe behind `GetUsage`), `parent` (the helper process), `report` (the
//! serialisable result).

mod child;
mod decode;
mod dynlib;
mod layout;
mod locate;
mod parent;
pub mod report;
mod set_profile;
mod status;
mod usage;

use std::{ffi::OsString, io, path::PathBuf, time::Duration};

use report::{AmdSmiReport, GpuUsage, ProbeFailure, ProbeOutcome};
pub use set_profile::ProfileRequest;

/// `AMDSMI_STATUS_BUSY`, the same in every release.
pub const STATUS_BUSY: u32 = status::BUSY;

/// Name of the hidden subcommand that runs the child side.
pub const PROBE_SUBCOMMAND: &str = "amdsmi-probe";

/// Environment variable naming a directory searched before any other (as AMD's own binding).
pub const LIB_DIR_ENV: &str = "AMDSMI_LIB_DIR";

/// How the daemon runs the AMD SMI probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmdSmiConfig {
    /// Which library to load.
    pub library: LibrarySource,
    /// Program and leading arguments that run the hidden `amdsmi-probe` subcommand.
    /// Production: `[current_exe]`.
    pub helper: Vec<OsString>,
    /// How long the child may take; it is killed (SIGKILL) after that.
    pub timeout: Duration,
    /// Extra environment for the child (added to the daemon's own).
    pub child_env: Vec<(OsString, OsString)>,
}

impl AmdSmiConfig {
    /// A config whose helper is this very executable.
    ///
    /// # Errors
    /// When the path of the running executable cannot be determined.
    pub fn with_current_exe(library: LibrarySource, timeout: Duration) -> io::Result<Self> {
        let exe = std::env::current_exe()?;
        Ok(Self {
            library,
            helper: vec![exe.into_os_string()],
            timeout,
            child_env: Vec::new(),
        })
    }
}

/// Where the AMD SMI library comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LibrarySource {
    /// Do not use AMD SMI at all.
    Disabled,
    /// Load exactly this file.
    Path(PathBuf),
    /// Try `$AMDSMI_LIB_DIR`, then each dir, with `libamd_smi.so.27`, `.26`, `.25`, `.24` and
    /// `libamd_smi.so`; then the bare sonames through the dynamic loader.
    Search { dirs: Vec<PathBuf> },
}

/// Arguments of the hidden `amdsmi-probe` subcommand.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct ProbeArgs {
    /// Load exactly this library file instead of searching.
    #[arg(long, value_name = "PATH", conflicts_with_all = ["search_dirs", "disabled"])]
    pub library: Option<PathBuf>,
    /// Directory to search for libamd_smi.so.{27,26,25,24} and libamd_smi.so (repeatable).
    #[arg(long = "search-dir", value_name = "DIR")]
    pub search_dirs: Vec<PathBuf>,
    /// Load nothing and report that AMD SMI is disabled.
    #[arg(long, conflicts_with = "search_dirs")]
    pub disabled: bool,
    /// Instead of probing, select accelerator partition profile INDEX on the
    /// GPU at BDF (`amdsmi_set_gpu_accelerator_partition_profile`).
    #[arg(long, value_name = "BDF=INDEX")]
    pub set_profile: Option<ProfileRequest>,
    /// Instead of probing, read only each GPU's activity and VRAM used (for
    /// `GetUsage`). Set by amd-gpud for its own child; no environment twin,
    /// so that the daemon's environment never turns it on.
    #[arg(long, hide = true, conflicts_with = "set_profile")]
    pub usage: bool,
}

impl ProbeArgs {
    /// The library source these arguments describe.
    pub fn source(&self) -> LibrarySource {
        match (&self.library, self.disabled) {
            (_, true) => LibrarySource::Disabled,
            (Some(path), false) => LibrarySource::Path(path.clone()),
            (None, false) => LibrarySource::Search {
                dirs: self.search_dirs.clone(),
            },
        }
    }
}

/// What the parent appends after `helper`: the subcommand name and its arguments.
pub fn probe_args(source: &LibrarySource) -> Vec<OsString> {
    let mut args = vec![OsString::from(PROBE_SUBCOMMAND)];
    match source {
        LibrarySource::Disabled => args.push("--disabled".into()),
        LibrarySource::Path(path) => {
            args.push("--library".into());
            args.push(path.clone().into_os_string());
        }
        LibrarySource::Search { dirs } => {
            for dir in dirs {
                args.push("--search-dir".into());
                args.push(dir.clone().into_os_string());
            }
        }
    }
    args
}

/// Parent side: runs the probe in a helper process and returns its report.
///
/// # Errors
/// Every [`AmdSmiError`] variant: the child's typed failures (load, version, init,
/// enumeration) come back as the same variants; the `Helper*` variants describe the child
/// process itself (spawn failure, timeout, death by signal, exit without a result).
pub fn probe(cfg: &AmdSmiConfig) -> Result<AmdSmiReport, AmdSmiError> {
    parent::probe(cfg)
}

/// Selects accelerator partition profile `profile_index` (AMD SMI's index
/// of the mode in the GPU's profile list; the caller derives it from
/// sysfs) on the GPU at `bdf`, in a helper
/// process as every AMD SMI call. Waiting for the new partitions is the
/// caller's.
///
/// # Errors
/// [`AmdSmiError::Status`] with the setter's status (BUSY when the GPU is in
/// use), [`AmdSmiError::HelperOutput`] when the library has no such GPU or no
/// setter, and every failure [`probe`] has.
pub fn set_accelerator_profile(
    cfg: &AmdSmiConfig,
    bdf: &str,
    profile_index: u32,
) -> Result<(), AmdSmiError> {
    let request = ProfileRequest {
        bdf: bdf.to_owned(),
        profile_index,
    };
    let extra = [OsString::from("--set-profile"), request.to_string().into()];
    let report = parent::run(cfg, &extra)?;
    let Some(switch) = report.profile_switch else {
        return Err(AmdSmiError::HelperOutput {
            library: report.library,
            reason: "no result of the profile switch".to_owned(),
        });
    };
    match switch.status {
        Some(status::SUCCESS) => Ok(()),
        Some(code) => Err(AmdSmiError::Status {
            call: dynlib::SET_PROFILE.to_owned(),
            device: Some(switch.bdf),
            status: code,
            name: switch.status_name,
        }),
        None => Err(AmdSmiError::HelperOutput {
            library: report.library,
            reason: format!("{}: {}", switch.bdf, switch.status_name),
        }),
    }
}

/// Each GPU's activity and VRAM used as AMD SMI reports them, from
/// `amdsmi-probe --usage` in a helper process killed after `timeout` (or
/// the configured timeout, whichever is shorter). Spawns nothing when AMD
/// SMI is disabled.
///
/// # Errors
/// [`AmdSmiError::Disabled`] when disabled, [`AmdSmiError::HelperOutput`]
/// when the helper answered without the usage list, and every failure
/// [`probe`] has.
pub fn gpu_usage(cfg: &AmdSmiConfig, timeout: Duration) -> Result<Vec<GpuUsage>, AmdSmiError> {
    let cfg = AmdSmiConfig {
        timeout: timeout.min(cfg.timeout),
        ..cfg.clone()
    };
    let report = parent::run_quiet(&cfg, &[OsString::from("--usage")])?;
    report.usage.ok_or_else(|| AmdSmiError::HelperOutput {
        library: report.library,
        reason: "no usage in its answer".to_owned(),
    })
}

/// Child side of `amdsmi-probe`: loads the library, probes it and writes exactly one JSON
/// [`ProbeOutcome`] line to `out`. Returns the process exit code: 0 for a report, 1 for a
/// typed failure, 2 when the document could not be written.
pub fn run_probe_command(args: &ProbeArgs, out: &mut dyn io::Write) -> i32 {
    let result = match &args.set_profile {
        Some(request) => set_profile::run(&args.source(), request),
        None if args.usage => usage::run(&args.source()),
        None => child::run(&args.source()),
    };
    let (outcome, code) = match result {
        Ok(report) => (ProbeOutcome::Ok { report }, 0),
        Err(error) => (ProbeOutcome::Error { error }, 1),
    };
    match write_outcome(&outcome, out) {
        Ok(()) => code,
        Err(err) => {
            tracing::warn!(error = %err, "cannot write the AMD SMI probe result");
            2
        }
    }
}

fn write_outcome(outcome: &ProbeOutcome, out: &mut dyn io::Write) -> io::Result<()> {
    let json = serde_json::to_string(outcome).map_err(io::Error::other)?;
    // The leading newline ends any partial line the library may have printed on stdout.
    writeln!(out, "\n{json}")?;
    out.flush()
}

/// Why AMD SMI data could not be obtained.
#[derive(Debug, thiserror::Error)]
pub enum AmdSmiError {
    #[error("AMD SMI is disabled by configuration")]
    Disabled,
    #[error("no AMD SMI library found (tried {})", .tried.join(", "))]
    NotFound { tried: Vec<String> },
    #[error("cannot load AMD SMI library {library}: {reason}")]
    Load { library: String, reason: String },
    #[error("AMD SMI library {library} does not export {symbol}")]
    MissingSymbol { library: String, symbol: String },
    #[error("AMD SMI library {library} reports version word {word}, an unknown ABI; not using it")]
    UnknownVersion { library: String, word: u32 },
    #[error("AMD SMI call {call}{} returned {name} ({status})", on_device(.device.as_deref()))]
    Status {
        call: String,
        device: Option<String>,
        status: u32,
        name: String,
    },
    #[error("cannot start the AMD SMI probe helper {program}")]
    HelperSpawn { program: String, source: io::Error },
    #[error("AMD SMI probe of {library} did not finish within {after:?}; the helper was killed")]
    HelperTimeout { library: String, after: Duration },
    #[error("AMD SMI probe helper for {library} died of signal {signal_name} ({signal})")]
    HelperKilled {
        library: String,
        signal: i32,
        signal_name: String,
    },
    #[error("AMD SMI probe helper for {library} exited with code {code} and no result: {stderr}")]
    HelperFailed {
        library: String,
        code: i32,
        stderr: String,
    },
    #[error("AMD SMI probe helper for {library} wrote no usable result: {reason}")]
    HelperOutput { library: String, reason: String },
}

fn on_device(device: Option<&str>) -> String {
    device.map_or_else(String::new, |d| format!(" on {d}"))
}

impl From<ProbeFailure> for AmdSmiError {
    fn from(failure: ProbeFailure) -> Self {
        match failure {
            ProbeFailure::Disabled => Self::Disabled,
            ProbeFailure::NotFound { tried } => Self::NotFound { tried },
            ProbeFailure::Load { library, reason } => Self::Load { library, reason },
            ProbeFailure::MissingSymbol { library, symbol } => {
                Self::MissingSymbol { library, symbol }
            }
            ProbeFailure::UnknownVersion { library, word } => {
                Self::UnknownVersion { library, word }
            }
            ProbeFailure::Status {
                call,
                device,
                status,
                name,
            } => Self::Status {
                call,
                device,
                status,
                name,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::{Parser, Subcommand};

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(Debug, Subcommand)]
    enum Cmd {
        #[command(name = "amdsmi-probe")]
        AmdsmiProbe(ProbeArgs),
    }

    fn round_trip(source: &LibrarySource) -> LibrarySource {
        let argv = std::iter::once(OsString::from("amd-gpud")).chain(probe_args(source));
        let Cmd::AmdsmiProbe(args) = Cli::try_parse_from(argv).expect("parses").cmd;
        args.source()
    }

    #[test]
    fn probe_args_round_trip_through_clap() {
        for source in [
            LibrarySource::Disabled,
            LibrarySource::Path("/opt/rocm-7.0.1/lib/libamd_smi.so.26".into()),
            LibrarySource::Path("relative dir/libamd_smi.so".into()),
            LibrarySource::Search { dirs: vec![] },
            LibrarySource::Search {
                dirs: vec!["/opt/rocm/lib".into(), "/usr/lib64".into()],
            },
        ] {
            assert_eq!(round_trip(&source), source);
        }
    }

    #[test]
    fn probe_args_start_with_the_subcommand() {
        let args = probe_args(&LibrarySource::Path("/x.so".into()));
        assert_eq!(args, ["amdsmi-probe", "--library", "/x.so"]);
        assert_eq!(
            probe_args(&LibrarySource::Search { dirs: vec![] }),
            ["amdsmi-probe"]
        );
    }

    #[test]
    fn conflicting_probe_args_are_rejected() {
        let argv = [
            "amd-gpud",
            "amdsmi-probe",
            "--library",
            "/x.so",
            "--search-dir",
            "/y",
        ];
        assert!(Cli::try_parse_from(argv).is_err());
    }

    #[test]
    fn status_errors_name_call_device_and_status() {
        let err = AmdSmiError::from(ProbeFailure::Status {
            call: "amdsmi_get_processor_handles".into(),
            device: Some("socket 1".into()),
            status: 30,
            name: "BUSY".into(),
        });
        let text = err.to_string();
        assert_eq!(
            text,
            "AMD SMI call amdsmi_get_processor_handles on socket 1 returned BUSY (30)"
        );
        let err = AmdSmiError::Status {
            call: "amdsmi_init".into(),
            device: None,
            status: 18,
            name: "INIT_ERROR".into(),
        };
        assert_eq!(
            err.to_string(),
            "AMD SMI call amdsmi_init returned INIT_ERROR (18)"
        );
    }

    #[test]
    fn the_child_writes_one_json_line() {
        let args = ProbeArgs {
            disabled: true,
            ..ProbeArgs::default()
        };
        let mut out = Vec::new();
        assert_eq!(run_probe_command(&args, &mut out), 1);
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "\n{\"outcome\":\"error\",\"error\":{\"kind\":\"disabled\"}}\n"
        );
    }

    #[test]
    fn a_missing_library_file_is_a_load_error() {
        let args = ProbeArgs {
            library: Some("/nonexistent/libamd_smi.so.26".into()),
            ..ProbeArgs::default()
        };
        let mut out = Vec::new();
        assert_eq!(run_probe_command(&args, &mut out), 1);
        let outcome: ProbeOutcome = serde_json::from_slice(&out).unwrap();
        let ProbeOutcome::Error {
            error: ProbeFailure::Load { library, reason },
        } = outcome
        else {
            panic!("expected a load failure, got {outcome:?}");
        };
        assert_eq!(library, "/nonexistent/libamd_smi.so.26");
        assert!(reason.contains("No such file"), "{reason}");
    }
}
