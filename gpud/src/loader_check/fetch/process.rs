//! The fetcher's side: `amd-gpud-loader-check loader-fetch`, started by
//! amd-gpud with its job on stdin (see the parent module for the exchange).

use std::{
    ffi::OsString,
    io::{self, BufRead, Write},
    time::{Duration, Instant},
};

use super::{FetchJob, GO, Step};
use crate::loader_check::{
    Descriptor, ImageSource,
    containerd::ContainerdSource,
    sandbox::{self, ChildFailure, Sandbox, child, wire},
};

/// The fetcher's command line: nothing but the subcommand; the job comes
/// on stdin.
#[derive(Debug, clap::Args)]
pub struct FetchArgs {}

/// Runs the fetcher on stdin and stdout. Returns the exit code: 0 when it
/// answered (a verdict, a failure or a cached image), 1 when it could not
/// talk to amd-gpud, 3 when it could not start.
pub fn run_fetch_command(_args: &FetchArgs) -> u8 {
    // amd-gpud's death ends the fetcher, and the fetcher's the inspector
    // (its pipes close).
    if let Err(err) =
        rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
    {
        eprintln!("amd-gpud loader-fetch: cannot set the parent-death signal: {err}");
        return 3;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("amd-gpud loader-fetch: cannot start its runtime: {err}");
            return 3;
        }
    };
    let (mut input, mut output) = (io::stdin().lock(), io::stdout().lock());
    match fetch(runtime.handle(), &mut input, &mut output) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("amd-gpud loader-fetch: {err}");
            1
        }
    }
}

/// Reads the job, looks the image up, and (when amd-gpud says so) has it
/// inspected.
fn fetch(
    handle: &tokio::runtime::Handle,
    input: &mut dyn BufRead,
    output: &mut dyn Write,
) -> io::Result<()> {
    let job: FetchJob =
        wire::read_line(input).map_err(|e| io::Error::other(format!("its job: {e}")))?;
    let started = Instant::now();
    let call_timeout = Duration::from_millis(job.call_timeout_ms);
    let looked_up = ContainerdSource::connect(
        &job.containerd_socket,
        &job.containerd_namespace,
        handle.clone(),
        call_timeout,
    )
    .and_then(|mut source| source.target(&job.image).map(|target| (source, target)));
    let (mut source, target) = match looked_up {
        Ok(found) => found,
        Err(err) => {
            let verdict = child::verdict(Err(err.into()));
            return wire::write_line(output, &Step::Verdict { verdict });
        }
    };
    wire::write_line(
        output,
        &Step::Target {
            target: (&target).into(),
        },
    )?;
    match wire::read_line::<String>(input) {
        Ok(go) if go == GO => {}
        // amd-gpud knows the image already (or went away).
        Err(wire::LineError::Closed) => return Ok(()),
        Ok(other) => return Err(io::Error::other(format!("amd-gpud said {other:?}"))),
        Err(err) => return Err(io::Error::other(err.to_string())),
    }
    let budget = Duration::from_millis(job.budget_ms).saturating_sub(started.elapsed());
    let step = inspect(&job, &mut source, &target, budget);
    wire::write_line(output, &step)
}

/// The inspector child's verdict on `target`, or why it gave none.
fn inspect(
    job: &FetchJob,
    source: &mut ContainerdSource,
    target: &Descriptor,
    budget: Duration,
) -> Step {
    let sandbox = Sandbox {
        helper: vec![this_program()],
        uid: job.inspector_uid,
        gid: job.inspector_gid,
        memory: job.inspector_memory,
        grace: Duration::from_millis(job.inspector_grace_ms),
    };
    match sandbox::inspect_in_child(&sandbox, source, target, &job.run, budget) {
        Ok(verdict) => Step::Verdict { verdict },
        Err(err) => {
            let started = !matches!(err, ChildFailure::Spawn { .. });
            Step::inspector_failed(&err.to_string(), started)
        }
    }
}

/// This executable: the inspector is the same program re-entered with
/// its own subcommand.
fn this_program() -> OsString {
    std::env::current_exe().map_or_else(
        |_| OsString::from("amd-gpud-loader-check"),
        std::path::PathBuf::into_os_string,
    )
}
