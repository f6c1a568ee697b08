//! One pod's caps written within a deadline: [`Dmem::set_pod_limits`] on a
//! thread of its own, waited for at most [`CAP_WRITE`], and no new write
//! while an earlier one is still blocked in the kernel ([`OVERDUE`]).

use std::{
    collections::BTreeMap,
    sync::{
        Arc,
        atomic::{AtomicU8, AtomicUsize, Ordering},
    },
    time::Duration,
};

use super::{Applied, Dmem, DmemError};
use crate::deadline::{self, Overdue};

/// How long the cgroup writes of one `SetPodVramLimits` may take. cgroupfs
/// answers at once; a write that takes longer is stuck in the kernel, and
/// the plugin waits 10 s for the whole call.
pub(crate) const CAP_WRITE: Duration = Duration::from_secs(5);

/// Cap writes that missed [`CAP_WRITE`] and are still blocked: while there
/// is one, no new write is started, so that a hung kernel cannot pile up
/// threads (writes that answer in time may run side by side).
static OVERDUE: AtomicUsize = AtomicUsize::new(0);

/// The states of one write: running, returned, or past its deadline.
const RUNNING: u8 = 0;
const DONE: u8 = 1;
const LATE: u8 = 2;

const WHAT: &str = "the VRAM cap write";

/// Why a timed cap write gave no [`Applied`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum CapWriteError {
    /// An earlier write missed its deadline and has not returned.
    #[error("an earlier VRAM cap write is still blocked in the kernel; try again later")]
    Busy,
    /// No thread could be had for the write.
    #[error(transparent)]
    Thread(Overdue),
    /// The write's thread panicked.
    #[error("the VRAM cap write failed")]
    Died,
    /// The write did not return within `limit` (its thread is left behind).
    #[error(
        "the VRAM cap write did not finish within {limit:?} (a cgroup file that never answers?)"
    )]
    Late { limit: Duration },
    /// The backend refused the caps.
    #[error(transparent)]
    Dmem(DmemError),
}

/// Sets `limits` on `pod_uid`'s cgroup on a thread of its own, waiting at
/// most [`CAP_WRITE`]. The caller's span goes with the work to its thread.
///
/// # Errors
/// See [`CapWriteError`].
pub(crate) async fn set_pod_limits_within(
    dmem: Arc<Dmem>,
    pod_uid: String,
    limits: BTreeMap<String, u64>,
) -> Result<Applied, CapWriteError> {
    let span = tracing::Span::current();
    if OVERDUE.load(Ordering::Acquire) > 0 {
        return Err(CapWriteError::Busy);
    }
    let state = Arc::new(AtomicU8::new(RUNNING));
    let seen = Arc::clone(&state);
    let write = move || {
        let applied = span.in_scope(|| dmem.set_pod_limits(&pod_uid, &limits));
        if seen.swap(DONE, Ordering::AcqRel) == LATE {
            OVERDUE.fetch_sub(1, Ordering::AcqRel);
        }
        applied
    };
    let done = deadline::spawn(WHAT, write).map_err(CapWriteError::Thread)?;
    match tokio::time::timeout(CAP_WRITE, done).await {
        Ok(Ok(applied)) => applied.map_err(CapWriteError::Dmem),
        Ok(Err(_)) => Err(CapWriteError::Died),
        Err(_) => {
            // Counted until the thread returns (it decrements, seeing LATE);
            // not at all when it returned in the meantime.
            OVERDUE.fetch_add(1, Ordering::AcqRel);
            if state
                .compare_exchange(RUNNING, LATE, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                OVERDUE.fetch_sub(1, Ordering::AcqRel);
            }
            Err(CapWriteError::Late { limit: CAP_WRITE })
        }
    }
}
