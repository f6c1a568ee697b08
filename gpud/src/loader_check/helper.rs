//! `amd-gpud-loader-check`: the loader check's helper binary, which amd-gpud
//! runs once per inspection (`loader-fetch`, root: containerd's content
//! store) and which re-enters itself as the unprivileged parser
//! (`loader-inspect`). A binary of its own so that the containerd client
//! and the image parsers are not in amd-gpud's executable at all: the
//! daemon's resident set holds none of their code (docs/benchmarks.md).

use std::{ffi::OsString, process::ExitCode};

use clap::{Parser, Subcommand};

use super::{
    fetch::process::{FetchArgs, run_fetch_command},
    sandbox::{InspectArgs, run_inspect_command},
};

/// `amd-gpud-loader-check`: reads and parses one container image for
/// amd-gpud's loader check. Not for running by hand: amd-gpud starts it.
#[derive(Debug, Parser)]
#[command(name = "amd-gpud-loader-check", version, about)]
struct HelperCli {
    #[command(subcommand)]
    command: HelperCommand,
}

#[derive(Debug, Subcommand)]
enum HelperCommand {
    /// Look one image up in containerd and have it parsed; the job is read
    /// from stdin, each step written to stdout as a JSON line (run by
    /// amd-gpud, as root).
    LoaderFetch(FetchArgs),
    /// Parse one image, its blobs read from stdin, its verdict written to
    /// stdout (run by `loader-fetch` as an unprivileged user).
    LoaderInspect(InspectArgs),
}

/// Entry point of the helper binary.
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli: HelperCli = match crate::command_line::parse(args) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let code = match cli.command {
        HelperCommand::LoaderFetch(args) => run_fetch_command(&args),
        HelperCommand::LoaderInspect(args) => run_inspect_command(&args),
    };
    ExitCode::from(code)
}
