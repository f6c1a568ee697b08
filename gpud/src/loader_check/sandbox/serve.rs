//! The parent's side (the loader check's fetcher, `super::super::fetch`):
//! spawns the inspector child, answers its questions from the image source,
//! kills it at the deadline, and reads back its verdict. The process
//! helpers below ([`watchdog`], [`finish`], [`keep_stderr`]) also serve
//! amd-gpud's side of the fetcher.

use std::{
    io::{self, BufReader, Read, Write},
    os::unix::process::{CommandExt, ExitStatusExt},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
        mpsc,
    },
    thread,
    time::{Duration, Instant},
};

use tracing::{debug, info, warn};

use super::{
    INSPECT_SUBCOMMAND, Sandbox,
    wire::{self, CHUNK, DATA, JOB, Job, LineError, Request, Verdict},
};
use crate::loader_check::{Descriptor, ImageSource, run::RunSpec};

/// What the child is called in logs.
const INSPECTOR: &str = "the image inspector";
/// Bytes of the child's stderr kept (the rest is drained).
const STDERR_KEPT: u64 = 4 << 10;
/// Bytes of it quoted in a failure.
const STDERR_QUOTED: usize = 400;
/// The most bytes of one blob the fetcher reads whole for the child: the
/// analysis's bound of a manifest, index or config (`Limits::max_json`).
pub(crate) const MAX_WHOLE_BLOB: u64 = 4 << 20;
/// Seconds after the deadline the fetcher still answers the child.
const SERVE_GRACE_SECS: u64 = 2;
/// How long a child that gave its verdict has to exit.
pub(crate) const EXIT_GRACE: Duration = Duration::from_secs(2);

/// Why the child gave no verdict.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ChildFailure {
    #[error("cannot start the image inspector {program}: {why}")]
    Spawn { program: String, why: String },
    #[error(
        "the image inspector was killed at the inspection's deadline ({budget:?} and {grace:?} of grace)"
    )]
    Deadline { budget: Duration, grace: Duration },
    #[error("the image inspector died of {signal}{hint}{}", quoted(.stderr))]
    Killed {
        signal: String,
        hint: &'static str,
        stderr: String,
    },
    #[error("the image inspector exited with status {code} without a verdict{}", quoted(.stderr))]
    Exited { code: i32, stderr: String },
    #[error("the image inspector was killed: {why}")]
    Protocol { why: String },
}

fn quoted(stderr: &str) -> String {
    if stderr.is_empty() {
        String::new()
    } else {
        format!("; it said: {stderr}")
    }
}

/// Inspects `target` in a child of `sandbox`, serving it from `source`,
/// within `budget`.
///
/// # Errors
/// [`ChildFailure`] when the child gives no verdict.
pub(crate) fn inspect_in_child(
    sandbox: &Sandbox,
    source: &mut dyn ImageSource,
    target: &Descriptor,
    run: &RunSpec,
    budget: Duration,
) -> Result<Verdict, ChildFailure> {
    let mut child = spawn(sandbox, budget)?;
    let pid = child.id();
    let stderr = keep_stderr(child.stderr.take());
    let killed = Arc::new(AtomicBool::new(false));
    let after = budget + sandbox.grace;
    let (cancel, watchdog) = watchdog((pid, INSPECTOR), after, Arc::clone(&killed));
    let served = match (child.stdin.take(), child.stdout.take()) {
        (Some(mut input), Some(output)) => {
            let job = Job {
                target: target.into(),
                run: run.clone(),
                budget_ms: u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
            };
            let mut output = BufReader::new(output);
            serve(source, &job, &mut input, &mut output)
        }
        _ => Err(Broke::Ended("no pipes to the child".to_owned())),
    };
    drop(cancel);
    let _joined = watchdog.join();
    if let Err(Broke::Ended(_)) = served {
        // It closed its end: give it the time to be reaped as it ended.
        thread::sleep(Duration::from_millis(20));
    }
    // After a verdict it has [`EXIT_GRACE`] to exit; without one it is
    // killed at once.
    let grace = if served.is_ok() {
        EXIT_GRACE
    } else {
        Duration::ZERO
    };
    let (status, _) = finish(&mut child, grace);
    let stderr = stderr.recv_timeout(EXIT_GRACE).unwrap_or_default();
    if !stderr.is_empty() {
        // In the fetcher, whose stderr amd-gpud logs (e.g. "no Landlock").
        info!(pid, stderr = %stderr.trim(), "the image inspector's stderr");
    }
    match served {
        Ok(verdict) => Ok(verdict),
        Err(_) if killed.load(Ordering::SeqCst) => Err(ChildFailure::Deadline {
            budget,
            grace: sandbox.grace,
        }),
        Err(Broke::Violated(why)) => Err(ChildFailure::Protocol { why }),
        Err(Broke::Ended(why)) => {
            debug!(pid, %why, "the image inspector ended without a verdict");
            Err(failure(status, &stderr, (budget, sandbox.grace)))
        }
    }
}

/// What a child that ended by itself without a verdict died of.
/// `times`: the budget and the grace it was given.
fn failure(status: Option<ExitStatus>, stderr: &str, times: (Duration, Duration)) -> ChildFailure {
    let start = stderr.len().saturating_sub(STDERR_QUOTED);
    let start = (start..stderr.len())
        .find(|i| stderr.is_char_boundary(*i))
        .unwrap_or(stderr.len());
    let stderr = stderr.get(start..).unwrap_or_default().trim().to_owned();
    match status {
        Some(s) if s.signal().is_some() => {
            let signal = s.signal().unwrap_or_default();
            ChildFailure::Killed {
                signal: signal_name(signal),
                hint: match signal {
                    libc::SIGABRT | libc::SIGSEGV | libc::SIGKILL => " (over its memory limit?)",
                    libc::SIGXCPU => " (over its CPU time limit)",
                    _ => "",
                },
                stderr,
            }
        }
        Some(s) if s.code() == Some(super::confine::OUT_OF_TIME) => ChildFailure::Deadline {
            budget: times.0,
            grace: times.1,
        },
        Some(s) => ChildFailure::Exited {
            code: s.code().unwrap_or(-1),
            stderr,
        },
        None => ChildFailure::Exited { code: -1, stderr },
    }
}

fn spawn(sandbox: &Sandbox, budget: Duration) -> Result<Child, ChildFailure> {
    let fail = |program: &str, why: String| ChildFailure::Spawn {
        program: program.to_owned(),
        why,
    };
    let Some((program, lead)) = sandbox.helper.split_first() else {
        return Err(fail("", "no program configured".to_owned()));
    };
    let name = program.to_string_lossy().into_owned();
    let cpu = budget.as_secs().saturating_add(sandbox.grace.as_secs()) + 1;
    let mut cmd = Command::new(program);
    cmd.args(lead)
        .arg(INSPECT_SUBCOMMAND)
        .arg("--memory")
        .arg(sandbox.memory.to_string())
        .arg("--cpu-seconds")
        .arg(cpu.to_string())
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if rustix::process::geteuid().is_root() {
        // As root, std drops every supplementary group with setgroups(0)
        // before setgid and setuid.
        cmd.uid(sandbox.uid).gid(sandbox.gid);
    } else {
        cmd.arg("--allow-root");
    }
    debug!(?cmd, "spawning the image inspector");
    cmd.spawn().map_err(|e| fail(&name, e.to_string()))
}

/// Kills `pid` (SIGKILL), the child `what` names ("the image inspector"),
/// unless cancelled within `after`; sets `killed` when it did. The child is
/// reaped only after this returns, so the pid is still its own.
pub(crate) fn watchdog(
    (pid, what): (u32, &'static str),
    after: Duration,
    killed: Arc<AtomicBool>,
) -> (mpsc::Sender<()>, thread::JoinHandle<()>) {
    let (cancel, cancelled) = mpsc::channel::<()>();
    let handle = thread::spawn(move || {
        if let Err(mpsc::RecvTimeoutError::Timeout) = cancelled.recv_timeout(after) {
            warn!(pid, ?after, "{what} missed its deadline; killing it");
            killed.store(true, Ordering::SeqCst);
            kill(pid);
        }
    });
    (cancel, handle)
}

fn kill(pid: u32) {
    if let Some(pid) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    {
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    }
}

/// Waits for the child (killing it if it does not exit within `grace`)
/// and reaps it. Returns its status, and whether it was killed here.
pub(crate) fn finish(child: &mut Child, grace: Duration) -> (Option<ExitStatus>, bool) {
    let until = Instant::now() + grace;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return (Some(status), false),
            Ok(None) if Instant::now() < until => thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                // Pipes are closed: a killed child cannot block; wait.
                return (child.wait().ok(), true);
            }
            Err(_) => return (None, false),
        }
    }
}

/// Reads the child's stderr on a thread, keeping [`STDERR_KEPT`] bytes.
pub(crate) fn keep_stderr(pipe: Option<impl Read + Send + 'static>) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    if let Some(mut pipe) = pipe {
        thread::spawn(move || {
            let mut kept = Vec::new();
            let _ = (&mut pipe).take(STDERR_KEPT).read_to_end(&mut kept);
            let _ = io::copy(&mut pipe, &mut io::sink());
            let _ = tx.send(String::from_utf8_lossy(&kept).into_owned());
        });
    }
    rx
}

/// Why the exchange with the child broke off.
#[derive(Debug)]
pub(crate) enum Broke {
    /// It closed its pipes (it exited, or was killed).
    Ended(String),
    /// It broke the protocol (a line too long, garbage): it is killed.
    Violated(String),
}

fn read(from: &mut dyn io::BufRead) -> Result<Request, Broke> {
    wire::read_request(from).map_err(|e| match e {
        LineError::Closed | LineError::Io(_) => Broke::Ended(e.to_string()),
        LineError::TooLong { .. } | LineError::Garbage { .. } => Broke::Violated(e.to_string()),
    })
}

fn sent(written: io::Result<()>) -> Result<(), Broke> {
    written.map_err(|e| Broke::Ended(format!("cannot write to it: {e}")))
}

/// Answers the child's questions until its verdict.
///
/// # Errors
/// [`Broke`]: why the exchange broke off (the child is then killed).
pub(crate) fn serve(
    source: &mut dyn ImageSource,
    job: &Job,
    to_child: &mut dyn Write,
    from_child: &mut dyn io::BufRead,
) -> Result<Verdict, Broke> {
    // Past this, nothing more is served (a child the fetcher may not kill
    // gets end of file instead).
    let until = Instant::now()
        + Duration::from_millis(job.budget_ms)
        + Duration::from_secs(SERVE_GRACE_SECS);
    let job = serde_json::to_vec(job).map_err(|e| Broke::Ended(e.to_string()))?;
    // A child that answers without reading its job (it failed) is heard.
    if let Err(err) = wire::write_frame(to_child, JOB, &job) {
        debug!(error = %err, "the image inspector did not take its job");
    }
    let mut pending = None;
    loop {
        let request = match pending.take() {
            Some(r) => r,
            None => read(from_child)?,
        };
        if Instant::now() > until && !matches!(request, Request::Verdict(_)) {
            return Err(Broke::Violated(
                "it was still asking after the inspection's deadline".to_owned(),
            ));
        }
        match request {
            Request::Verdict(verdict) => return Ok(verdict),
            Request::Blob { desc, max } => {
                let desc: Descriptor = desc.into();
                // The child's bound is its word: the fetcher reads no more
                // into its own memory than a manifest or config may be.
                let max = max.min(MAX_WHOLE_BLOB);
                sent(match source.read_blob(&desc, max) {
                    Ok(bytes) => wire::write_frame(to_child, DATA, &bytes),
                    Err(err) => wire::write_error(to_child, &err),
                })?;
            }
            Request::Next => sent(wire::write_frame(to_child, DATA, &[]))?,
            Request::Open { desc } => {
                let desc: Descriptor = desc.into();
                let mut stream = match source.open_blob(&desc) {
                    Ok(stream) => stream,
                    Err(err) => {
                        sent(wire::write_error(to_child, &err))?;
                        continue;
                    }
                };
                sent(wire::write_frame(to_child, DATA, &[]))?;
                let next = stream_chunks(&mut stream, &desc, to_child, from_child, until);
                pending = Some(next?);
            }
        }
    }
}

/// Answers [`Request::Next`] with chunks of `stream` until another request
/// comes, which it returns.
fn stream_chunks(
    stream: &mut dyn Read,
    desc: &Descriptor,
    to_child: &mut dyn Write,
    from_child: &mut dyn io::BufRead,
    until: Instant,
) -> Result<Request, Broke> {
    let mut buf = vec![0; CHUNK];
    loop {
        let request = read(from_child)?;
        if request != Request::Next {
            return Ok(request);
        }
        if Instant::now() > until {
            return Err(Broke::Violated(
                "it was still reading after the inspection's deadline".to_owned(),
            ));
        }
        let written = match read_some(stream, &mut buf) {
            Ok(n) => wire::write_frame(to_child, DATA, buf.get(..n).unwrap_or_default()),
            Err(err) => {
                let err = crate::loader_check::SourceError::Rpc {
                    call: "Content.Read",
                    why: format!("blob {}: {err}", desc.digest),
                };
                wire::write_error(to_child, &err)
            }
        };
        sent(written)?;
    }
}

/// One read that is retried when interrupted; 0 at the end.
fn read_some(stream: &mut dyn Read, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

pub(crate) fn signal_name(signal: i32) -> String {
    match signal {
        libc::SIGABRT => "SIGABRT".to_owned(),
        libc::SIGKILL => "SIGKILL".to_owned(),
        libc::SIGSEGV => "SIGSEGV".to_owned(),
        libc::SIGBUS => "SIGBUS".to_owned(),
        libc::SIGXCPU => "SIGXCPU".to_owned(),
        libc::SIGSYS => "SIGSYS".to_owned(),
        other => format!("signal {other}"),
    }
}
