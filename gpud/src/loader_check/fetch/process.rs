//! The fetcher's side: `amd-gpud-loader-check loader-fetch`, started by
//! amd-gpud with its job on stdin (see the parent module for the exchange).

use std::{
    ffi::OsString,
    io::{self, BufRead, Write},
    time::{Duration, Instant},
};

use super::{FetchJob, GO, MAX_STEP_LINE, Step};
use crate::loader_check::{
    Descriptor, ImageSource,
    containerd::ContainerdSource,
    sandbox::{self, ChildFailure, Sandbox, child, confine, wire},
};

/// How the fetcher names itself on stderr.
const ME: &str = "amd-gpud-loader-check loader-fetch";

/// The fetcher's command line: nothing but the subcommand; the job comes
/// on stdin.
#[derive(Debug, clap::Args)]
pub struct FetchArgs {}

/// Runs the fetcher on stdin and stdout. Returns the exit code: 0 when it
/// answered (a verdict, a failure or a cached image), 1 when it could not
/// talk to amd-gpud, 3 when it could not start.
pub fn run_fetch_command(_args: &FetchArgs) -> u8 {
    // amd-gpud's death ends the fetcher (and so the inspector).
    if let Err(err) = confine::die_with_parent() {
        eprintln!("{ME}: cannot follow amd-gpud (PR_SET_PDEATHSIG): {err}");
        return 3;
    }
    // Warnings (an inspector killed at its deadline, its stderr) go to
    // stderr, which amd-gpud logs.
    let _ = tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .without_time()
        .with_target(false)
        .try_init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("{ME}: cannot start its runtime: {err}");
            return 3;
        }
    };
    let (mut input, mut output) = (io::stdin().lock(), io::stdout().lock());
    match fetch(runtime.handle(), &mut input, &mut output) {
        Ok(()) => 0,
        Err(err) => {
            eprintln!("{ME}: {err}");
            1
        }
    }
}

/// Reads the job, looks the image up, and (when amd-gpud says so) has it
/// inspected.
pub(crate) fn fetch(
    handle: &tokio::runtime::Handle,
    input: &mut dyn BufRead,
    output: &mut dyn Write,
) -> io::Result<()> {
    let job: FetchJob = wire::read_line(input, wire::MAX_JOB)
        .map_err(|e| io::Error::other(format!("its job: {e}")))?;
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
            return wire::write_line(output, &Step::Verdict { verdict }, MAX_STEP_LINE);
        }
    };
    let target_line = Step::Target {
        target: (&target).into(),
    };
    wire::write_line(output, &target_line, MAX_STEP_LINE)?;
    match wire::read_line::<String>(input, wire::MAX_LINE) {
        Ok(go) if go == GO => {}
        // amd-gpud knows the image already (or went away).
        Err(wire::LineError::Closed) => return Ok(()),
        Ok(other) => return Err(io::Error::other(format!("amd-gpud said {other:?}"))),
        Err(err) => return Err(io::Error::other(err.to_string())),
    }
    let budget = Duration::from_millis(job.budget_ms).saturating_sub(started.elapsed());
    let step = inspect(&job, &mut source, &target, budget);
    wire::write_line(output, &step, MAX_STEP_LINE)
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
