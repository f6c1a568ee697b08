//! Running a command as another UID, with a timeout.

use std::{
    io::{self, Read},
    process::{Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use super::{POLL, context};

const SETPRIV: &str = "setpriv";

/// What a command run by [`run_as`] did.
#[derive(Clone, Debug)]
pub struct RunOutput {
    /// Exit code; `None` when a signal ended it.
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl RunOutput {
    /// Exit code 0.
    pub fn success(&self) -> bool {
        self.code == Some(0)
    }
}

/// Runs `program args` as `uid`/`gid` through `setpriv --reuid --regid --clear-groups`
/// (directly when `uid` is 0), killing it after `timeout`.
///
/// # Errors
/// When it cannot be spawned, or (`TimedOut`) when it outlives `timeout`.
pub fn run_as(
    uid: u32,
    gid: u32,
    program: &str,
    args: &[&str],
    timeout: Duration,
) -> io::Result<RunOutput> {
    let mut cmd = if uid == 0 {
        Command::new(program)
    } else {
        let mut cmd = Command::new(SETPRIV);
        cmd.arg(format!("--reuid={uid}"))
            .arg(format!("--regid={gid}"))
            .arg("--clear-groups")
            .arg("--")
            .arg(program);
        cmd
    };
    let mut child = cmd
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| context(e, &format!("cannot run {program} as uid {uid}")))?;
    let stdout = drain(child.stdout.take());
    let stderr = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("{program} {args:?} as uid {uid} ran longer than {timeout:?}"),
            ));
        }
        thread::sleep(POLL);
    };
    Ok(RunOutput {
        code: status.code(),
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// Reads a pipe to the end on a thread (so neither pipe can fill up and block the child).
fn drain(pipe: Option<impl Read + Send + 'static>) -> thread::JoinHandle<String> {
    thread::spawn(move || {
        let mut bytes = Vec::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_end(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bus::{CALL_TIMEOUT, PLUGIN_UID, tests::root_or_skip};

    #[test]
    fn run_as_switches_uid_and_groups() {
        if !root_or_skip("run_as_switches_uid_and_groups") {
            return;
        }
        let out = run_as(PLUGIN_UID, PLUGIN_UID, "id", &[], CALL_TIMEOUT).unwrap();
        assert!(out.success(), "{out:?}");
        let want = format!("uid={PLUGIN_UID}(");
        assert!(out.stdout.starts_with(&want), "{out:?}");
        assert!(
            !out.stdout.contains("groups=0(") && !out.stdout.contains(",0("),
            "{out:?}"
        );
    }

    #[test]
    fn run_as_kills_after_the_timeout() {
        let started = Instant::now();
        let err = run_as(0, 0, "sleep", &["5"], Duration::from_millis(200)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
        assert!(started.elapsed() < Duration::from_secs(4));
    }
}
