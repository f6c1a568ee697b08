//! The D-Bus side of VRAM caps: `SetPodVramLimits` and the `Dmem*`
//! properties of the node, over [`crate::dmem`]. Only conversion and error
//! mapping live here; the node object checks the caller's UID.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{
        Arc,
        atomic::{AtomicU8, AtomicUsize, Ordering},
    },
    time::Duration,
};

use ipc::ApiError;
use zbus::zvariant::Value;

use crate::{
    deadline,
    dmem::{Dmem, DmemError, Kind, Status},
};

/// The typed D-Bus error of a [`DmemError`], with its whole message.
pub fn api_error(err: &DmemError) -> ApiError {
    let text = err.to_string();
    match err.kind() {
        Kind::InvalidArgument => ApiError::InvalidArgument(text),
        Kind::NotSupported => ApiError::NotSupported(text),
        Kind::NotFound => ApiError::NotFound(text),
        Kind::Failed => ApiError::Failed(text),
    }
}

/// The smallest VRAM cap a caller may set: HAMi grants VRAM in MiB, and a
/// cap below that (0 above all) would leave the pod's containers no VRAM
/// at all, a denial of service rather than a limit. Caps above a GPU's
/// region are refused by [`Dmem::set_pod_limits`].
pub const MIN_CAP: u64 = 1 << 20;

/// How long the cgroup writes of one `SetPodVramLimits` may take. cgroupfs
/// answers at once; a write that takes longer is stuck in the kernel, and
/// the plugin waits 10 s for the whole call.
pub const CAP_WRITE: Duration = Duration::from_secs(5);

/// Cap writes that missed [`CAP_WRITE`] and are still blocked: while there
/// is one, no new write is started, so that a hung kernel cannot pile up
/// threads (writes that answer in time may run side by side).
static OVERDUE: AtomicUsize = AtomicUsize::new(0);

/// The states of one write: running, returned, or past its deadline.
const RUNNING: u8 = 0;
const DONE: u8 = 1;
const LATE: u8 = 2;

/// Sets the limits on a thread of its own, waiting at most [`CAP_WRITE`];
/// returns the pod's cgroup path in the
/// hierarchy (`/kubepods.slice/...`).
///
/// # Errors
/// `InvalidArgument` for a cap below [`MIN_CAP`]; the mapped
/// [`DmemError`], or `Failed` when the blocking task dies.
pub async fn set_pod_limits(
    dmem: Arc<Dmem>,
    pod_uid: String,
    limits: HashMap<String, u64>,
) -> Result<String, ApiError> {
    if let Some((gpu, bytes)) = limits.iter().find(|(_, bytes)| **bytes < MIN_CAP) {
        let gpu: String = gpu.chars().take(32).collect();
        tracing::warn!(gpu, bytes, "SetPodVramLimits refused: a cap below 1 MiB");
        return Err(ApiError::InvalidArgument(format!(
            "{bytes} bytes for {gpu:?}: a VRAM cap must be at least {MIN_CAP} bytes (1 MiB)"
        )));
    }
    let limits: BTreeMap<String, u64> = limits.into_iter().collect();
    // The caller's span (method, caller UID) goes with the work to its thread.
    let span = tracing::Span::current();
    if OVERDUE.load(Ordering::Acquire) > 0 {
        return Err(ApiError::Busy(
            "an earlier VRAM cap write is still blocked in the kernel; try again later".into(),
        ));
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
    let done = deadline::spawn("the VRAM cap write", write)
        .map_err(|e| ApiError::Failed(e.to_string()))?;
    let applied = match tokio::time::timeout(CAP_WRITE, done).await {
        Ok(Ok(applied)) => applied,
        Ok(Err(_)) => return Err(ApiError::Failed("the VRAM cap write failed".into())),
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
            tracing::error!("SetPodVramLimits: the cgroup write did not finish within {CAP_WRITE:?}");
            return Err(ApiError::Failed(format!(
                "the VRAM cap write did not finish within {CAP_WRITE:?} (a cgroup file that never answers?)"
            )));
        }
    }
    .map_err(|e| {
        tracing::warn!("SetPodVramLimits refused: {e}");
        api_error(&e)
    })?;
    Ok(format!("/{}", applied.cgroup.display()))
}

/// `DmemRegions`: PCI address to the bytes of its VRAM region.
pub fn regions(status: &Status) -> HashMap<String, u64> {
    status
        .regions
        .iter()
        .map(|(bdf, n)| (bdf.clone(), *n))
        .collect()
}

/// `DmemCgroupDriver`: `systemd`, `cgroupfs`, or empty when unknown.
pub fn driver(status: &Status) -> String {
    status.driver.map(|d| d.to_string()).unwrap_or_default()
}

/// `DmemKubepods`: the kubepods cgroup's path in the hierarchy, or empty.
pub fn kubepods(status: &Status) -> String {
    status
        .kubepods
        .as_ref()
        .map(|p| format!("/{}", p.display()))
        .unwrap_or_default()
}

/// The `Dmem*` properties, for `PropertiesChanged`.
pub fn properties(status: &Status) -> Vec<(&'static str, Value<'static>)> {
    vec![
        ("DmemBackend", Value::from(status.backend())),
        ("DmemRegions", Value::from(regions(status))),
        ("DmemCgroupDriver", Value::from(driver(status))),
        ("DmemKubepods", Value::from(kubepods(status))),
    ]
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::dmem::{DmemError, Driver, uid::PodUid};

    #[test]
    fn kinds_map_to_typed_errors() {
        let off = DmemError::Off {
            reason: "no kubepods".into(),
        };
        assert!(matches!(api_error(&off), ApiError::NotSupported(m) if m.contains("no kubepods")));
        let uid = DmemError::from(PodUid::parse("..").unwrap_err());
        assert!(matches!(api_error(&uid), ApiError::InvalidArgument(_)));
        let missing = DmemError::Resolve(crate::dmem::resolve::ResolveError::NotFound {
            uid: PodUid::parse("6f1e3a0e0c8b2d9f7a6b5c4d3e2f1a0b").unwrap(),
            kubepods: PathBuf::from("/sys/fs/cgroup/kubepods"),
            tried: Vec::new(),
        });
        assert!(matches!(api_error(&missing), ApiError::NotFound(m) if m.contains("kubepods")));
    }

    #[test]
    fn properties_of_an_on_backend() {
        let status = Status {
            off: None,
            regions: [("0000:03:00.0".to_owned(), 17)].into_iter().collect(),
            driver: Some(Driver::Systemd),
            kubepods: Some(PathBuf::from("kubepods.slice")),
        };
        assert_eq!(driver(&status), "systemd");
        assert_eq!(kubepods(&status), "/kubepods.slice");
        assert_eq!(regions(&status)["0000:03:00.0"], 17);
        let off = Status {
            off: Some("no kubepods".to_owned()),
            ..Status::default()
        };
        assert_eq!(properties(&off)[0].1, Value::from("off: no kubepods"));
        assert_eq!(properties(&off)[2].1, Value::from(""));
    }
}
