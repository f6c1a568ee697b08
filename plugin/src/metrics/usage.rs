//! What HAMi granted the live pods of this node, per GPU, from the
//! scheduler's `hami.io/amd-devices-allocated` (a metric only: nothing is
//! allocated from it). A pod counts while it is neither finished, deleted nor
//! marked `hami.io/bind-phase: failed`.

use std::{collections::HashMap, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use crate::hami::{ALLOCATED_KEY, DevicesAnnotation, parse_pod_devices};

const MIB: u64 = 1024 * 1024;

/// What the live pods hold of one GPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuUsage {
    pub(crate) compute_units: u64,
    pub(crate) vram_bytes: u64,
    /// Containers holding a share of the GPU.
    pub(crate) containers: u64,
}

/// Usage by GPU id.
pub type Usage = HashMap<String, GpuUsage>;

pub(crate) fn live(pod: &Pod) -> bool {
    let finished = matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    );
    let failed = pod
        .annotations()
        .get("hami.io/bind-phase")
        .is_some_and(|p| p == "failed");
    !finished && !failed && pod.metadata.deletion_timestamp.is_none()
}

/// Sums the grants of the live pods in `pods` (a value that does not parse
/// is skipped).
pub(crate) fn usage(pods: &[Arc<Pod>]) -> Usage {
    let mut usage = Usage::new();
    for pod in pods.iter().filter(|p| live(p)) {
        let Some(value) = pod.annotations().get(ALLOCATED_KEY) else {
            continue;
        };
        let Ok(containers) = parse_pod_devices(DevicesAnnotation::Allocated, value) else {
            continue;
        };
        for device in containers.iter().flatten() {
            let entry = usage.entry(device.uuid.clone()).or_default();
            entry.compute_units += u64::from(device.usedcores);
            entry.vram_bytes += u64::from(device.usedmem) * MIB;
            entry.containers += 1;
        }
    }
    usage
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(annotations: serde_json::Value, phase: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": "p", "annotations": annotations},
                "status": {"phase": phase}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn live_grants_are_summed_per_gpu() {
        let pods = [
            pod(
                json!({ALLOCATED_KEY: "A,T,1024,76:B,T,2048,38:;A,T,1024,76:;"}),
                "Running",
            ),
            pod(json!({ALLOCATED_KEY: "A,T,1,1:;"}), "Succeeded"),
            pod(
                json!({ALLOCATED_KEY: "A,T,1,1:;", "hami.io/bind-phase": "failed"}),
                "Pending",
            ),
            pod(json!({ALLOCATED_KEY: "broken"}), "Running"),
            pod(json!({}), "Running"),
        ];
        let usage = usage(&pods);
        assert_eq!(
            usage["A"],
            GpuUsage {
                compute_units: 152,
                vram_bytes: 2048 * MIB,
                containers: 2
            }
        );
        assert_eq!(usage["B"].containers, 1);
        assert_eq!(usage.len(), 2);
    }
}
