//! The D-Bus side of VRAM caps: `SetPodVramLimits` and the `Dmem*`
//! properties of the node, over [`crate::dmem`] (the timed write is
//! [`crate::dmem::cap_write`]). Only validation of the wire values,
//! conversion and error mapping live here; the node object checks the
//! caller's UID.

use std::{
    collections::{BTreeMap, HashMap},
    sync::Arc,
};

use ipc::ApiError;
use zbus::zvariant::Value;

use crate::dmem::{
    Dmem, DmemError, Kind, Status,
    cap_write::{self, CapWriteError},
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

/// Sets the limits within [`crate::dmem::cap_write::CAP_WRITE`]; returns
/// the pod's cgroup path in the hierarchy (`/kubepods.slice/...`).
///
/// # Errors
/// `InvalidArgument` for a cap below [`MIN_CAP`]; the mapped
/// [`CapWriteError`].
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
    let applied = cap_write::set_pod_limits_within(dmem, pod_uid, limits)
        .await
        .map_err(|e| write_error(&e))?;
    Ok(format!("/{}", applied.cgroup.display()))
}

/// The typed D-Bus error of a failed timed write, logged.
fn write_error(err: &CapWriteError) -> ApiError {
    match err {
        CapWriteError::Busy => ApiError::Busy(err.to_string()),
        CapWriteError::Dmem(e) => {
            tracing::warn!("SetPodVramLimits refused: {e}");
            api_error(e)
        }
        CapWriteError::Late { limit } => {
            tracing::error!("SetPodVramLimits: the cgroup write did not finish within {limit:?}");
            ApiError::Failed(err.to_string())
        }
        CapWriteError::Thread(_) | CapWriteError::Died => ApiError::Failed(err.to_string()),
    }
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
    fn timed_write_errors_keep_their_texts() {
        let busy = write_error(&CapWriteError::Busy);
        assert!(matches!(busy, ApiError::Busy(m) if m.contains("still blocked")));
        let late = write_error(&CapWriteError::Late {
            limit: cap_write::CAP_WRITE,
        });
        assert!(matches!(late, ApiError::Failed(m) if m.contains("did not finish within 5s")));
        let died = write_error(&CapWriteError::Died);
        assert!(matches!(died, ApiError::Failed(m) if m == "the VRAM cap write failed"));
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
