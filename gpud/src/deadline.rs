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
//!
//! The reading thread says which file it is at ([`reading`], called by the
//! readers of the host tree before each open), so that a read that misses
//! its deadline names the file it is blocked on.

use std::{
    cell::RefCell,
    fmt,
    path::{Path, PathBuf},
    sync::{Arc, Mutex, PoisonError, mpsc},
    time::Duration,
};

/// How long the sysfs part of a read may take; an AMD SMI probe adds its
/// own timeout. A whole read of an 8-GPU node in CPX (64 partitions) takes
/// a few milliseconds.
pub const SYSFS_READ: Duration = Duration::from_secs(10);

/// A read of the host tree that did not finish in time, or whose thread
/// could not be had.
#[derive(Debug, thiserror::Error)]
pub enum Overdue {
    #[error("{what} did not finish within {limit:?}{at} (a sysfs read that never returns?)")]
    Late {
        what: &'static str,
        limit: Duration,
        /// The file the read was at when the deadline passed.
        at: At,
    },
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

/// Where a host read is: the last path its thread announced with
/// [`reading`]. Shared between the reading thread and its waiter.
#[derive(Debug, Clone, Default)]
pub struct Progress(Arc<Mutex<Option<PathBuf>>>);

impl Progress {
    /// The file the read is at now, for [`Overdue::Late`].
    pub fn at(&self) -> At {
        At(self
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone())
    }
}

/// The file a late read was at, shown as `, blocked at <path>` (nothing
/// when the read announced none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct At(pub Option<PathBuf>);

impl fmt::Display for At {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(path) => write!(f, ", blocked at {}", path.display()),
            None => Ok(()),
        }
    }
}

thread_local! {
    /// The [`Progress`] of the host read running on this thread, if any.
    static PROGRESS: RefCell<Option<Progress>> = const { RefCell::new(None) };
}

/// Announces that the host read on this thread is about to open or list
/// `path`; nothing outside a read started here.
pub fn reading(path: &Path) {
    PROGRESS.with_borrow(|progress| {
        if let Some(progress) = progress {
            let mut slot = progress.0.lock().unwrap_or_else(PoisonError::into_inner);
            // Reuses the slot's allocation: a read announces hundreds of paths.
            match slot.as_mut() {
                Some(last) => {
                    let last = last.as_mut_os_string();
                    last.clear();
                    last.push(path.as_os_str());
                }
                None => *slot = Some(path.to_owned()),
            }
        }
    });
}

/// Starts `read` on a thread of its own that announces its files into the
/// returned [`Progress`].
fn start<T: Send + 'static>(
    what: &'static str,
    read: impl FnOnce() -> T + Send + 'static,
    send: impl FnOnce(T) + Send + 'static,
) -> Result<Progress, Overdue> {
    let progress = Progress::default();
    let theirs = progress.clone();
    std::thread::Builder::new()
        .name("host-read".to_owned())
        .spawn(move || {
            PROGRESS.with_borrow_mut(|slot| *slot = Some(theirs));
            send(read());
        })
        .map_err(|source| Overdue::Thread { what, source })?;
    Ok(progress)
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
    spawn_watched(what, read).map(|(rx, _)| rx)
}

/// [`spawn`], with the [`Progress`] of the read, for the error of a read
/// that misses its deadline.
///
/// # Errors
/// [`Overdue::Thread`] when the thread cannot be started.
pub fn spawn_watched<T: Send + 'static>(
    what: &'static str,
    read: impl FnOnce() -> T + Send + 'static,
) -> Result<(tokio::sync::oneshot::Receiver<T>, Progress), Overdue> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let progress = start(what, read, move |out| drop(tx.send(out)))?;
    Ok((rx, progress))
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
    let progress = start(what, read, move |out| drop(tx.send(out)))?;
    rx.recv_timeout(limit).map_err(|err| match err {
        mpsc::RecvTimeoutError::Timeout => Overdue::Late {
            what,
            limit,
            at: progress.at(),
        },
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
            reading(Path::new("/first"));
            reading(Path::new("/the/blocking/file"));
            let _ = parked.recv();
        });
        let text = late.as_ref().map(drop).unwrap_err().to_string();
        assert!(text.contains(", blocked at /the/blocking/file ("), "{text}");
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
