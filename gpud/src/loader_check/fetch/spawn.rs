//! amd-gpud's side: one fetcher process per inspection, answered from the
//! cache by the digest it reports, killed past the inspection's deadline.

use std::{
    ffi::OsString,
    io::BufReader,
    process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tracing::{debug, info};

use super::{FETCH_GRACE, FETCH_SUBCOMMAND, FetchJob, GO, MAX_STEP_LINE, Step};
use crate::loader_check::{
    Descriptor, Finding,
    checker::{CheckError, Inspect, Known},
    run::RunSpec,
    sandbox::{
        self, Sandbox,
        wire::{self, FailKind, LineError, Verdict},
    },
};

/// How long a fetcher that broke off the exchange has to exit by itself.
const BROKEN_GRACE: Duration = Duration::from_millis(250);

/// What the fetcher is called in logs and answers.
const FETCHER: &str = "the image fetcher";

/// Inspections through a fetcher process each.
#[derive(Debug, Clone)]
pub struct ForkedInspect {
    /// Program and leading arguments of the helper binary
    /// (`amd-gpud-loader-check`; `[fake-node]` in tests).
    pub helper: Vec<OsString>,
    pub containerd_socket: std::path::PathBuf,
    pub containerd_namespace: String,
    /// Each call to containerd (and each chunk of a layer).
    pub call_timeout: Duration,
    /// The inspector child the fetcher starts (its `helper` is unused:
    /// the fetcher re-enters itself).
    pub sandbox: Sandbox,
}

/// What went wrong with the fetcher itself.
#[derive(Debug)]
enum FetchFailure {
    /// It could not be started: nothing was learnt of the image.
    Spawn(String),
    /// It ended, was killed or broke the exchange (`why` continues "the
    /// image fetcher"); `target`: the digest it had reported by then;
    /// `at_deadline`: it was killed for outliving the inspection, the one
    /// failure of the fetcher an image can cause (and so cached).
    Broke {
        why: String,
        target: Option<String>,
        at_deadline: bool,
    },
}

impl FetchFailure {
    fn broke(why: String, target: Option<&Descriptor>) -> Self {
        Self::Broke {
            why,
            target: target.map(|t| t.digest.clone()),
            at_deadline: false,
        }
    }
}

impl Inspect for ForkedInspect {
    fn inspect(
        &self,
        image: &str,
        run: &RunSpec,
        deadline: Instant,
        cached: &dyn Fn(&str) -> Option<Known>,
    ) -> Result<Finding, CheckError> {
        let budget = deadline.saturating_duration_since(Instant::now());
        let job = self.job(image, run, budget);
        let kill_after = budget + self.sandbox.grace + FETCH_GRACE;
        let outcome = run_fetcher(&self.helper, &job, kill_after, cached);
        let failed = |key: Option<String>, why: String| CheckError::Failed {
            image: image.to_owned(),
            cache_key: key,
            why,
        };
        match outcome {
            Ok(Outcome::Cached(key, known)) => known.map_err(|why| failed(Some(key), why)),
            Ok(Outcome::Inspected { target, verdict }) => {
                let key = run.cache_key(&target.digest);
                from_verdict(image, target, verdict, &key)
            }
            Ok(Outcome::NotLookedUp(verdict)) => Err(match verdict {
                Verdict::Failed {
                    kind: FailKind::NotPresent,
                    why,
                    ..
                } => CheckError::NotPresent(why),
                Verdict::Failed {
                    kind: FailKind::NoRuntime,
                    why,
                    ..
                } => CheckError::NoRuntime(why),
                Verdict::Failed { why, .. } => failed(None, why),
                Verdict::Found { .. } => failed(
                    None,
                    "the image fetcher gave a verdict before the image's digest".to_owned(),
                ),
            }),
            Ok(Outcome::InspectorFailed {
                target,
                why,
                started,
            }) => Err(failed(started.then(|| run.cache_key(&target.digest)), why)),
            Err(FetchFailure::Spawn(why)) => Err(failed(None, why)),
            Err(FetchFailure::Broke {
                why,
                target,
                at_deadline,
            }) => {
                let key = target.filter(|_| at_deadline).map(|d| run.cache_key(&d));
                Err(failed(key, why))
            }
        }
    }
}

impl ForkedInspect {
    fn job(&self, image: &str, run: &RunSpec, budget: Duration) -> FetchJob {
        let millis = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        FetchJob {
            image: image.to_owned(),
            run: run.clone(),
            budget_ms: millis(budget),
            containerd_socket: self.containerd_socket.clone(),
            containerd_namespace: self.containerd_namespace.clone(),
            call_timeout_ms: millis(self.call_timeout),
            inspector_uid: self.sandbox.uid,
            inspector_gid: self.sandbox.gid,
            inspector_memory: self.sandbox.memory,
            inspector_grace_ms: millis(self.sandbox.grace),
        }
    }
}

/// The finding or failure an inspected image's verdict says, kept under
/// `key` when it is the image's own.
fn from_verdict(
    image: &str,
    target: Descriptor,
    verdict: Verdict,
    key: &str,
) -> Result<Finding, CheckError> {
    match verdict {
        Verdict::Found { loader, evidence } => Ok(Finding {
            digest: target.digest,
            loader,
            evidence,
        }),
        Verdict::Failed { kind, why, lasting } => Err(match kind {
            FailKind::NotPresent => CheckError::NotPresent(why),
            FailKind::NoRuntime => CheckError::NoRuntime(why),
            FailKind::Content => CheckError::Failed {
                image: image.to_owned(),
                cache_key: lasting.then(|| key.to_owned()),
                why,
            },
        }),
    }
}

/// How the exchange with one fetcher ended.
enum Outcome {
    /// The digest's cache key was known: its finding or failure.
    Cached(String, Known),
    Inspected {
        target: Descriptor,
        verdict: Verdict,
    },
    /// The image could not be looked up (the verdict says why).
    NotLookedUp(Verdict),
    InspectorFailed {
        target: Descriptor,
        why: String,
        started: bool,
    },
}

/// Starts the fetcher, hands it `job`, and follows it to its outcome;
/// kills it after `kill_after`.
fn run_fetcher(
    helper: &[OsString],
    job: &FetchJob,
    kill_after: Duration,
    cached: &dyn Fn(&str) -> Option<Known>,
) -> Result<Outcome, FetchFailure> {
    let mut child = spawn(helper)?;
    let pid = child.id();
    let stderr = sandbox::keep_stderr(child.stderr.take());
    let killed = Arc::new(AtomicBool::new(false));
    let (cancel, watchdog) = sandbox::watchdog((pid, FETCHER), kill_after, Arc::clone(&killed));
    let exchanged = match (child.stdin.take(), child.stdout.take()) {
        (Some(input), Some(output)) => exchange(job, input, output, cached),
        _ => Err(FetchFailure::broke("had no pipes".to_owned(), None)),
    };
    drop(cancel);
    let _joined = watchdog.join();
    // This blocking thread outlives the fetcher (reaped here), so the
    // fetcher's parent-death signal, tied to it, never fires early.
    // After its answer, or after it broke off (it may be exiting: its
    // status then says how), it has a moment to exit by itself.
    let grace = if exchanged.is_ok() {
        sandbox::EXIT_GRACE
    } else {
        BROKEN_GRACE
    };
    let (status, ended_here) = sandbox::finish(&mut child, grace);
    let stderr = stderr
        .recv_timeout(Duration::from_secs(2))
        .unwrap_or_default();
    if !stderr.is_empty() {
        info!(pid, stderr = %stderr.trim(), "the image fetcher's stderr");
    }
    let at_deadline = killed.load(Ordering::SeqCst);
    exchanged.map_err(|failure| match failure {
        FetchFailure::Broke { why, target, .. } => FetchFailure::Broke {
            why: if at_deadline {
                format!("{FETCHER} was killed {kill_after:?} after it started")
            } else if ended_here {
                format!("{FETCHER} {why} (amd-gpud then ended it)")
            } else {
                format!("{FETCHER} {why}{}", ended(status))
            },
            target,
            at_deadline,
        },
        spawn @ FetchFailure::Spawn(_) => spawn,
    })
}

fn exchange(
    job: &FetchJob,
    mut input: ChildStdin,
    output: ChildStdout,
    cached: &dyn Fn(&str) -> Option<Known>,
) -> Result<Outcome, FetchFailure> {
    let mut output = BufReader::new(output);
    let broke = FetchFailure::broke;
    wire::write_line(&mut input, job, wire::MAX_JOB)
        .map_err(|e| broke(format!("did not take its job: {e}"), None))?;
    let read = |output: &mut BufReader<ChildStdout>, target: Option<&Descriptor>| {
        wire::read_line::<Step>(output, MAX_STEP_LINE).map_err(|e| broke(said(&e), target))
    };
    let target = match read(&mut output, None)? {
        Step::Target { target } => Descriptor::from(target),
        Step::Verdict { verdict } => return Ok(Outcome::NotLookedUp(verdict)),
        Step::InspectorFailed { why, .. } => {
            return Err(broke(
                format!("failed before it found the image: {why}"),
                None,
            ));
        }
    };
    let key = job.run.cache_key(&target.digest);
    if let Some(known) = cached(&key) {
        debug!(digest = %target.digest, "known already; the fetcher ends");
        return Ok(Outcome::Cached(key, known));
    }
    wire::write_line(&mut input, &GO, wire::MAX_LINE)
        .map_err(|e| broke(format!("did not take its go-ahead: {e}"), Some(&target)))?;
    match read(&mut output, Some(&target))? {
        Step::Verdict { verdict } => Ok(Outcome::Inspected { target, verdict }),
        Step::InspectorFailed { why, started } => Ok(Outcome::InspectorFailed {
            target,
            why,
            started,
        }),
        Step::Target { .. } => Err(broke("reported a second target".to_owned(), Some(&target))),
    }
}

/// A broken line, as "the image fetcher ..." continues.
fn said(err: &LineError) -> String {
    match err {
        LineError::Closed => "ended without an answer".to_owned(),
        other => format!("broke the exchange: {other}"),
    }
}

/// " (it exited with status 1)", " (it died of SIGSEGV)", or nothing.
fn ended(status: Option<ExitStatus>) -> String {
    use std::os::unix::process::ExitStatusExt;
    match status {
        Some(s) if s.signal().is_some() => {
            format!(
                " (it died of {})",
                sandbox::signal_name(s.signal().unwrap_or_default())
            )
        }
        Some(s) => format!(" (it exited with status {})", s.code().unwrap_or(-1)),
        None => String::new(),
    }
}

fn spawn(helper: &[OsString]) -> Result<Child, FetchFailure> {
    let Some((program, lead)) = helper.split_first() else {
        return Err(FetchFailure::Spawn(
            "no image fetcher program configured".to_owned(),
        ));
    };
    let mut cmd = Command::new(program);
    cmd.args(lead)
        .arg(FETCH_SUBCOMMAND)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    debug!(?cmd, "spawning the image fetcher");
    cmd.spawn().map_err(|e| {
        FetchFailure::Spawn(format!(
            "cannot start the image fetcher {}: {e}",
            program.to_string_lossy()
        ))
    })
}
