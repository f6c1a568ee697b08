//! The loader check's inspector in a child process (issue 38): the
//! loader check's fetcher (`super::fetch`, root, started by amd-gpud)
//! reads the image's blobs from the container runtime and hands them to
//! this child, which parses them (manifests, tar, gzip, zstd, ELF), so that
//! an image built to exhaust memory or time costs the child, never amd-gpud
//! nor the fetcher.
//!
//! The child is the helper binary (`amd-gpud-loader-check`) re-entered by
//! the fetcher with the hidden [`INSPECT_SUBCOMMAND`]. It runs as
//! [`Sandbox::uid`]/[`Sandbox::gid`] with no supplementary groups, an empty
//! environment and `/` as its directory, confines itself before it reads
//! its job ([`confine`]: no new privileges, death with its parent, memory,
//! CPU time, no processes, no files, Landlock), and can reach nothing but
//! the pipes: it asks for each blob and the fetcher streams it ([`wire`]).
//! The fetcher reads back only lines of at most [`wire::MAX_LINE`] bytes,
//! kills the child at the inspection's deadline (plus [`Sandbox::grace`]),
//! and turns its death, silence or garbage into a failure naming the image,
//! cached like any other.

pub(crate) mod child;
pub(crate) mod confine;
mod serve;
pub(crate) mod wire;

use std::{ffi::OsString, time::Duration};

pub(crate) use serve::{
    ChildFailure, EXIT_GRACE, finish, inspect_in_child, keep_stderr, signal_name, watchdog,
};

/// The hidden subcommand that runs the child side.
pub const INSPECT_SUBCOMMAND: &str = "loader-inspect";

/// The UID and GID the child runs as: `amd-gpud-inspect` of
/// `systemd/amd-gpud.sysusers.conf`, owning nothing on the host.
pub const INSPECT_UID: u32 = 60702;

/// How the fetcher runs its inspector children.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    /// Program and leading arguments of the helper binary (the fetcher's
    /// own executable; fake-node in tests); unused on amd-gpud's side,
    /// which passes the rest of this to the fetcher.
    pub helper: Vec<OsString>,
    /// The child's UID and GID when amd-gpud runs as root.
    pub uid: u32,
    pub gid: u32,
    /// Bytes of memory (heap) the child may use.
    pub memory: u64,
    /// How long after the inspection's deadline the child is killed (it
    /// answers "out of time" itself at the deadline).
    pub grace: Duration,
}

impl Sandbox {
    /// The default: `helper`, [`INSPECT_UID`], 1 GiB, 2 s.
    #[must_use]
    pub fn new(helper: Vec<OsString>) -> Self {
        Self {
            helper,
            uid: INSPECT_UID,
            gid: INSPECT_UID,
            memory: 1 << 30,
            grace: Duration::from_secs(2),
        }
    }
}

/// The child's command line: `amd-gpud-loader-check loader-inspect --memory
/// BYTES --cpu-seconds N [--allow-root]`.
#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    /// Bytes of heap the child allows itself.
    #[arg(long, env = "GPUD_INSPECT_MEMORY")]
    pub memory: u64,
    /// CPU seconds the child allows itself, and wall-clock seconds it
    /// lives at most.
    #[arg(long, env = "GPUD_INSPECT_CPU_SECONDS")]
    pub cpu_seconds: u64,
    /// Run even as root (the fetcher was not root, so could not drop it).
    #[arg(long, env = "GPUD_INSPECT_ALLOW_ROOT")]
    pub allow_root: bool,
}

/// Runs the child side on stdin and stdout: confines itself, inspects,
/// answers. Returns the exit code.
pub fn run_inspect_command(args: &InspectArgs) -> u8 {
    let limits = confine::ChildLimits {
        memory: args.memory,
        cpu: Duration::from_secs(args.cpu_seconds),
    };
    confine::end_after(limits.cpu);
    if let Err(err) = confine::confine(limits, args.allow_root) {
        eprintln!("amd-gpud-loader-check loader-inspect: refusing to run: {err}");
        return 3;
    }
    match child::serve(std::io::stdin(), std::io::stdout()) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("amd-gpud-loader-check loader-inspect: {err}");
            1
        }
    }
}

#[cfg(test)]
mod tests;
