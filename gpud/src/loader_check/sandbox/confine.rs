//! What the inspector child does to itself before it reads a byte of the
//! image: no new privileges, death with its parent, not dumpable (no ptrace
//! by its own UID), the first victim of an out-of-memory kill, resource
//! limits, and (where the kernel has Landlock) no file system access at
//! all.
//!
//! The UID and GID (and no supplementary groups) are set by the fetcher when it
//! spawns the child (`std::process::Command::uid`); the rest is done here,
//! in code of the child that runs before the job is read, so that no
//! `unsafe` `pre_exec` hook is needed.

use std::time::Duration;

use rustix::process::{Resource, Rlimit, setrlimit};

/// The limits the child puts on itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ChildLimits {
    /// Bytes of heap and other private writable memory (`RLIMIT_DATA`);
    /// the address space (`RLIMIT_AS`) is held to this plus
    /// [`MAPPINGS`] for the executable and its libraries.
    pub memory: u64,
    /// CPU time (`RLIMIT_CPU`): the kernel kills it past this.
    pub cpu: Duration,
}

/// Address space beyond `memory` for the mapped executable, its libraries
/// and stacks (a debug build of the test binaries maps about 200 MiB).
pub(crate) const MAPPINGS: u64 = 512 << 20;
/// Open files: stdin, stdout, stderr and what the dynamic loader held when
/// the limit was set; no new file beyond those.
const OPEN_FILES: u64 = 4;

/// Why the child refused to start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfineError {
    #[error("cannot set {what}: {source}")]
    Sys {
        what: &'static str,
        #[source]
        source: rustix::io::Errno,
    },
    #[error("it runs as root (UID 0); the inspector must not")]
    Root,
}

fn limit(resource: Resource, what: &'static str, value: u64) -> Result<(), ConfineError> {
    let rlimit = Rlimit {
        current: Some(value),
        maximum: Some(value),
    };
    setrlimit(resource, rlimit).map_err(|source| ConfineError::Sys { what, source })
}

/// Confines the calling process (the child, before it reads its job).
/// `allow_root`: the fetcher did not run as root, so could not change the
/// child's UID (a developer's run); as root it must have.
///
/// # Errors
/// [`ConfineError`]: the child then exits without inspecting anything.
pub(crate) fn confine(limits: ChildLimits, allow_root: bool) -> Result<(), ConfineError> {
    if !allow_root && rustix::process::geteuid().is_root() {
        return Err(ConfineError::Root);
    }
    let sys = |what| move |source| ConfineError::Sys { what, source };
    rustix::thread::set_no_new_privs(true).map_err(sys("no_new_privs"))?;
    die_with_parent().map_err(sys("PR_SET_PDEATHSIG"))?;
    // Raising one's own score needs no privilege; the file is our own
    // while we are dumpable (after, /proc makes it root's).
    std::fs::write("/proc/self/oom_score_adj", "1000").map_err(|e| ConfineError::Sys {
        what: "oom_score_adj",
        source: rustix::io::Errno::from_io_error(&e).unwrap_or(rustix::io::Errno::IO),
    })?;
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::NotDumpable)
        .map_err(sys("PR_SET_DUMPABLE"))?;
    limit(Resource::Data, "RLIMIT_DATA", limits.memory)?;
    limit(
        Resource::As,
        "RLIMIT_AS",
        limits.memory.saturating_add(MAPPINGS),
    )?;
    let cpu = limits.cpu.as_secs().max(1);
    limit(Resource::Cpu, "RLIMIT_CPU", cpu)?;
    limit(Resource::Nproc, "RLIMIT_NPROC", 0)?;
    limit(Resource::Core, "RLIMIT_CORE", 0)?;
    limit(Resource::Fsize, "RLIMIT_FSIZE", 0)?;
    if let Err(err) = landlock_nothing() {
        // The UID, the limits and the pipes still hold; said on stderr,
        // which the fetcher passes on to amd-gpud's log.
        eprintln!("amd-gpud-loader-check loader-inspect: no Landlock: {err}");
    }
    limit(Resource::Nofile, "RLIMIT_NOFILE", OPEN_FILES)?;
    Ok(())
}

/// Has the kernel kill this process when its parent dies (the fetcher, or
/// amd-gpud for the fetcher), so that a killed parent leaves no child
/// running on; a parent already gone by then is `ESRCH`.
///
/// # Errors
/// The `prctl` failed, or the parent died before it took effect.
pub(crate) fn die_with_parent() -> Result<(), rustix::io::Errno> {
    let parent = rustix::process::getppid();
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    if rustix::process::getppid() == parent {
        Ok(())
    } else {
        Err(rustix::io::Errno::SRCH)
    }
}

/// The exit status of a child that ran out of wall-clock time.
pub(crate) const OUT_OF_TIME: i32 = 124;

/// Ends the process with [`OUT_OF_TIME`] after `wall`, whatever its main
/// thread is doing. The fetcher kills a late child itself, but without
/// `CAP_KILL` (its unit grants none) it may not signal another UID: this
/// thread is what ends the child then. Started before [`confine`], which
/// forbids new threads.
#[expect(
    clippy::exit,
    reason = "the main thread may be deep in a parse: only ending the process stops it"
)]
pub(crate) fn end_after(wall: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(wall);
        eprintln!("amd-gpud-loader-check loader-inspect: out of wall-clock time ({wall:?})");
        std::process::exit(OUT_OF_TIME);
    });
}

/// Takes every file system right Landlock knows away (best effort: an older
/// kernel enforces fewer, a kernel without Landlock none).
fn landlock_nothing() -> Result<(), landlock::RulesetError> {
    use landlock::{ABI, Access, AccessFs, Ruleset, RulesetAttr};
    let status = Ruleset::default()
        .handle_access(AccessFs::from_all(ABI::V5))?
        .create()?
        .restrict_self()?;
    tracing::debug!(?status.ruleset, "landlock");
    Ok(())
}
