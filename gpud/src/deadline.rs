//! Deadlines on reads of the host tree.
//!
//! A sysfs read can block in the kernel for as long as the driver does (a
//! hung GPU, a driver stuck in a reset), and no file option makes it give
//! up. So a whole read of the host (the KFD topology, DRM, the dmem cgroup
//! files, the AMD SMI probe) runs on a thread of its own, and the caller
//! waits for it only until a deadline. A read that misses it is abandoned:
//! its thread stays blocked (a plain thread, not the runtime's blocking
//! pool, so that stopping the daemon does not wait for it), and no other
//! read is started until it returns (see `service::scans`).

use std::{sync::mpsc, time::Duration};

/// How long the sysfs part of a read may take; an AMD SMI probe adds its
/// own timeout. A whole read of an 8-GPU node in CPX (64 partitions) takes
/// a few milliseconds.
pub const SYSFS_READ: Duration = Duration::from_secs(10);

/// A read of the host tree that did not finish in time, or whose thread
/// could not be had.
#[derive(Debug, thiserror::Error)]
pub enum Overdue {
    #[error("{what} did not finish within {limit:?} (a sysfs read that never returns?)")]
    Late { what: &'static str, limit: Duration },
    #[error("{what} is still blocked in the kernel since an earlier read missed its deadline")]
    StillBlocked { what: &'static str },
    #[error("cannot start a thread for {what}: {source}")]
    Thread {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{what} failed (its thread panicked)")]
    Died { what: &'static str },
}

/// Runs `read` on a thread named after `what` and hands its result to the
/// returned receiver.
///
/// # Errors
/// [`Overdue::Thread`] when the thread cannot be started.
pub fn spawn<T: Send + 'static>(
    what: &'static str,
    read: impl FnOnce() -> T + Send + 'static,
) -> Result<tokio::sync::oneshot::Receiver<T>, Overdue> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("host-read".to_owned())
        .spawn(move || drop(tx.send(read())))
        .map_err(|source| Overdue::Thread { what, source })?;
    Ok(rx)
}

/// Runs `read` on a thread of its own and waits for it at most `limit`
/// (blocking the caller; for the command line).
///
/// # Errors
/// [`Overdue::Late`] when it did not finish in time (the thread is left
/// behind; the process is expected to exit), or when it could not start.
pub fn within<T: Send + 'static>(
    what: &'static str,
    limit: Duration,
    read: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Overdue> {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("host-read".to_owned())
        .spawn(move || drop(tx.send(read())))
        .map_err(|source| Overdue::Thread { what, source })?;
    rx.recv_timeout(limit).map_err(|err| match err {
        mpsc::RecvTimeoutError::Timeout => Overdue::Late { what, limit },
        mpsc::RecvTimeoutError::Disconnected => Overdue::Died { what },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_that_never_returns_is_abandoned_at_its_deadline() {
        let (_keep, parked) = mpsc::channel::<()>();
        let late = within("the test read", Duration::from_millis(50), move || {
            let _ = parked.recv();
        });
        assert!(
            matches!(
                late,
                Err(Overdue::Late {
                    what: "the test read",
                    ..
                })
            ),
            "{late:?}"
        );
        assert_eq!(within("a quick read", SYSFS_READ, || 7).unwrap(), 7);
    }
}
