//! Parent side: runs the probe helper, enforces the timeout, decodes its one JSON document.

use std::{
    ffi::OsString,
    io::{self, Read},
    os::unix::process::ExitStatusExt,
    path::PathBuf,
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc::{self, Receiver},
    thread,
    time::{Duration, Instant},
};

use tracing::{debug, info, info_span, warn};

use super::{
    AmdSmiConfig, AmdSmiError, LIB_DIR_ENV, LibrarySource, probe_args,
    report::{AmdSmiReport, ProbeOutcome},
};

/// Most stdout we keep (a report for 64 partitions is well under 1 MiB).
const MAX_STDOUT: u64 = 16 << 20;
/// Most stderr we keep; the rest is drained and dropped.
const MAX_STDERR: u64 = 1 << 20;
/// How much of stderr goes into `HelperFailed`.
const STDERR_TAIL: usize = 4096;
/// How long to wait for pipes to close once the helper is gone.
const PIPE_GRACE: Duration = Duration::from_secs(2);
/// How long to wait for a SIGKILLed helper to be reaped before leaving it to a thread.
const REAP_GRACE: Duration = Duration::from_secs(2);
const POLL: Duration = Duration::from_millis(5);

/// What a finished helper left behind.
struct Finished {
    status: ExitStatus,
    stdout: Result<Vec<u8>, String>,
    stderr: Vec<u8>,
}

pub fn probe(cfg: &AmdSmiConfig) -> Result<AmdSmiReport, AmdSmiError> {
    run(cfg, &[])
}

/// Runs the helper with `extra` arguments after the probe's own.
pub fn run(cfg: &AmdSmiConfig, extra: &[OsString]) -> Result<AmdSmiReport, AmdSmiError> {
    let library = describe(cfg);
    let span = info_span!("probe", library = %library);
    let _entered = span.enter();
    if cfg.library == LibrarySource::Disabled {
        info!("AMD SMI disabled");
        return Err(AmdSmiError::Disabled);
    }
    let result = run_and_decode(cfg, &library, extra, false);
    match &result {
        Ok(report) => info!(
            layout = %report.layout,
            processors = report.processors.len(),
            call_errors = report.errors.len(),
            "AMD SMI probe done"
        ),
        Err(err) => debug!(error = %err, "AMD SMI probe failed"),
    }
    result
}

/// As [`run`], for a probe run again and again (`--usage`): what the helper
/// did goes to the debug log only, the caller says why it failed.
pub fn run_quiet(cfg: &AmdSmiConfig, extra: &[OsString]) -> Result<AmdSmiReport, AmdSmiError> {
    if cfg.library == LibrarySource::Disabled {
        return Err(AmdSmiError::Disabled);
    }
    let library = describe(cfg);
    run_and_decode(cfg, &library, extra, true)
}

fn run_and_decode(
    cfg: &AmdSmiConfig,
    library: &str,
    extra: &[OsString],
    quiet: bool,
) -> Result<AmdSmiReport, AmdSmiError> {
    let finished = run_helper(cfg, library, extra, quiet)?;
    for line in String::from_utf8_lossy(&finished.stderr).lines() {
        debug!(target: "gpud::amdsmi::helper", "{line}");
    }
    decode(finished, library, quiet)
}

/// A short operator-facing description of where the child will look for the library.
fn describe(cfg: &AmdSmiConfig) -> String {
    match &cfg.library {
        LibrarySource::Disabled => "disabled".to_owned(),
        LibrarySource::Path(path) => path.display().to_string(),
        LibrarySource::Search { dirs } => {
            // The child inherits our environment plus `child_env`, which wins.
            let env_dir = cfg.child_env.iter().rev().find(|(k, _)| k == LIB_DIR_ENV);
            let env_dir = env_dir
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var_os(LIB_DIR_ENV));
            let env_dir = env_dir.filter(|d| !d.is_empty()).map(PathBuf::from);
            let dirs: Vec<String> = env_dir
                .iter()
                .chain(dirs)
                .map(|d| d.display().to_string())
                .collect();
            if dirs.is_empty() {
                "search (loader path)".to_owned()
            } else {
                format!("search {} (then loader path)", dirs.join(":"))
            }
        }
    }
}

fn run_helper(
    cfg: &AmdSmiConfig,
    library: &str,
    extra: &[OsString],
    quiet: bool,
) -> Result<Finished, AmdSmiError> {
    let Some((program, lead)) = cfg.helper.split_first() else {
        let source = io::Error::new(io::ErrorKind::InvalidInput, "no helper program configured");
        return Err(AmdSmiError::HelperSpawn {
            program: String::new(),
            source,
        });
    };
    let mut cmd = Command::new(program);
    cmd.args(lead)
        .args(probe_args(&cfg.library))
        .args(extra)
        .envs(cfg.child_env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    debug!(?cmd, "spawning the AMD SMI probe helper");
    let program = program.to_string_lossy().into_owned();
    let mut child = cmd
        .spawn()
        .map_err(|source| AmdSmiError::HelperSpawn { program, source })?;
    let stdout = read_pipe(child.stdout.take(), MAX_STDOUT);
    let stderr = read_pipe(child.stderr.take(), MAX_STDERR);
    let status = match wait_until(&mut child, Instant::now() + cfg.timeout) {
        Ok(Some(status)) => status,
        Ok(None) => {
            let pid = child.id();
            if quiet {
                debug!(pid, after = ?cfg.timeout, "AMD SMI probe helper timed out; killing it");
            } else {
                warn!(pid, after = ?cfg.timeout, "AMD SMI probe helper timed out; killing it");
            }
            kill_and_reap(child);
            let stderr = stderr.recv_timeout(PIPE_GRACE).ok().and_then(Result::ok);
            warn_stderr(&stderr.unwrap_or_default(), quiet);
            return Err(AmdSmiError::HelperTimeout {
                library: library.to_owned(),
                after: cfg.timeout,
            });
        }
        Err(err) => {
            kill_and_reap(child);
            let reason = format!("cannot wait for the helper: {err}");
            return Err(AmdSmiError::HelperOutput {
                library: library.to_owned(),
                reason,
            });
        }
    };
    let stdout = match stdout.recv_timeout(PIPE_GRACE) {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(err)) => Err(format!("cannot read its stdout: {err}")),
        Err(_) => Err("its stdout stayed open after it exited".to_owned()),
    };
    let stderr = stderr
        .recv_timeout(PIPE_GRACE)
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    Ok(Finished {
        status,
        stdout,
        stderr,
    })
}

/// Reads a pipe to its end on a thread, keeping at most `limit` bytes.
fn read_pipe(
    pipe: Option<impl Read + Send + 'static>,
    limit: u64,
) -> Receiver<io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::channel();
    let Some(mut pipe) = pipe else {
        // Cannot happen with Stdio::piped(); an absent pipe reads as empty.
        let _unsent = tx.send(Ok(Vec::new()));
        return rx;
    };
    thread::spawn(move || {
        let mut kept = Vec::new();
        let read = (&mut pipe)
            .take(limit)
            .read_to_end(&mut kept)
            .and_then(|_| io::copy(&mut pipe, &mut io::sink()))
            .map(|_| kept);
        // The receiver may have given up already; nothing to do then.
        let _unsent = tx.send(read);
    });
    rx
}

/// Polls the child until it exits (`Some`) or `deadline` passes (`None`).
fn wait_until(child: &mut Child, deadline: Instant) -> io::Result<Option<ExitStatus>> {
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        thread::sleep(POLL.min(deadline - now));
    }
}

/// SIGKILLs the child and reaps it. A child stuck in the kernel (D state on a wedged GPU)
/// cannot die until its syscall returns, so after a grace period a thread takes over reaping.
fn kill_and_reap(mut child: Child) {
    if let Err(err) = child.kill() {
        warn!(error = %err, "cannot kill the AMD SMI probe helper");
    }
    match wait_until(&mut child, Instant::now() + REAP_GRACE) {
        Ok(Some(status)) => debug!(%status, "AMD SMI probe helper reaped"),
        Ok(None) => {
            warn!(
                pid = child.id(),
                "killed AMD SMI probe helper is stuck; reaping it in the background"
            );
            thread::spawn(move || child.wait());
        }
        Err(err) => warn!(error = %err, "cannot reap the AMD SMI probe helper"),
    }
}

/// Parses the child's document: the whole output, else the last line that parses (the
/// library may print to stdout before or after it).
fn parse_outcome(stdout: &[u8]) -> Result<ProbeOutcome, String> {
    let text = String::from_utf8_lossy(stdout);
    let text = text.trim();
    if text.is_empty() {
        return Err("it printed nothing".to_owned());
    }
    serde_json::from_str(text).or_else(|whole| {
        text.lines()
            .rev()
            .filter(|line| line.trim_start().starts_with('{'))
            .find_map(|line| serde_json::from_str(line).ok())
            .ok_or_else(|| format!("its output is not a probe result: {whole}"))
    })
}

fn decode(finished: Finished, library: &str, quiet: bool) -> Result<AmdSmiReport, AmdSmiError> {
    let outcome = finished.stdout.and_then(|out| parse_outcome(&out));
    if let Some(signal) = finished.status.signal() {
        let signal_name = signal_name(signal);
        match outcome {
            Ok(outcome) => {
                warn!(
                    signal_name,
                    "AMD SMI probe helper died after writing its result; using it"
                );
                return into_result(outcome);
            }
            Err(_) => {
                warn_stderr(&finished.stderr, quiet);
                return Err(AmdSmiError::HelperKilled {
                    library: library.to_owned(),
                    signal,
                    signal_name,
                });
            }
        }
    }
    match (outcome, finished.status.code()) {
        (Ok(outcome), _) => into_result(outcome),
        (Err(reason), Some(0)) => Err(AmdSmiError::HelperOutput {
            library: library.to_owned(),
            reason,
        }),
        (Err(_), code) => Err(AmdSmiError::HelperFailed {
            library: library.to_owned(),
            code: code.unwrap_or(-1),
            stderr: tail(&finished.stderr),
        }),
    }
}

fn into_result(outcome: ProbeOutcome) -> Result<AmdSmiReport, AmdSmiError> {
    match outcome {
        ProbeOutcome::Ok { report } => Ok(report),
        ProbeOutcome::Error { error } => Err(error.into()),
    }
}

/// Logs what a helper that hung or crashed last wrote on stderr (its own
/// logs); at debug only when `quiet`.
fn warn_stderr(stderr: &[u8], quiet: bool) {
    let tail = tail(stderr);
    if tail.is_empty() {
        return;
    }
    if quiet {
        debug!(stderr = %tail, "last output of the AMD SMI probe helper");
    } else {
        warn!(stderr = %tail, "last output of the AMD SMI probe helper");
    }
}

/// The last `STDERR_TAIL` bytes of stderr, trimmed.
fn tail(stderr: &[u8]) -> String {
    let start = stderr.len().saturating_sub(STDERR_TAIL);
    String::from_utf8_lossy(stderr.get(start..).unwrap_or_default())
        .trim()
        .to_owned()
}

/// Conventional name of a Linux signal number.
pub fn signal_name(signal: i32) -> String {
    let name = match signal {
        libc::SIGHUP => "SIGHUP",
        libc::SIGINT => "SIGINT",
        libc::SIGQUIT => "SIGQUIT",
        libc::SIGILL => "SIGILL",
        libc::SIGTRAP => "SIGTRAP",
        libc::SIGABRT => "SIGABRT",
        libc::SIGBUS => "SIGBUS",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGUSR1 => "SIGUSR1",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGUSR2 => "SIGUSR2",
        libc::SIGPIPE => "SIGPIPE",
        libc::SIGALRM => "SIGALRM",
        libc::SIGTERM => "SIGTERM",
        libc::SIGXCPU => "SIGXCPU",
        libc::SIGXFSZ => "SIGXFSZ",
        libc::SIGSYS => "SIGSYS",
        other => return format!("signal {other}"),
    };
    name.to_owned()
}

#[cfg(test)]
mod tests;
