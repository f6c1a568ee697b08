//! `COMPUTE_PARTITION=<mode>`: at start, ask amd-gpud to switch every idle
//! GPU that offers the mode. amd-gpud owns the switch and refuses a GPU in
//! use; the plugin adds what only it knows: whether pods on this node hold
//! allocations on the GPU (from the watch cache).

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    devices::gpu_id,
    gpud_client::{Bus, Snapshot, connect},
    hami::{ALLOCATED_KEY, DevicesAnnotation, parse_pod_devices},
    kube::{CALL_TIMEOUT, Caches},
    partition::{self, MODE_ANNOTATION, OperatingMode},
};

/// The operating mode: the node annotation when set, else the flag.
pub async fn operating_mode(
    client: Option<&Client>,
    node: &str,
    flag: OperatingMode,
) -> OperatingMode {
    let Some(client) = client else { return flag };
    let nodes: Api<Node> = Api::all(client.clone());
    let mode = match tokio::time::timeout(CALL_TIMEOUT, nodes.get(node)).await {
        Ok(Ok(n)) => partition::resolve(
            n.annotations().get(MODE_ANNOTATION).map(String::as_str),
            flag,
        ),
        Ok(Err(err)) => {
            warn!("reading node {node} for {MODE_ANNOTATION}: {err}; using --operating-mode");
            flag
        }
        Err(_) => {
            warn!("reading node {node} for {MODE_ANNOTATION} timed out; using --operating-mode");
            flag
        }
    };
    info!(?mode, "operating mode");
    mode
}

/// Whether a live pod holds an allocation on the GPU whose id is `gpu_id`
/// (the GPU itself, or one of its partitions `<gpu_id>-<mode><n>`).
pub fn allocations_on(pods: &[std::sync::Arc<Pod>], gpu_id: &str) -> bool {
    let prefix = format!("{gpu_id}-");
    pods.iter()
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            )
        })
        .filter_map(|p| p.annotations().get(ALLOCATED_KEY))
        .filter_map(|v| parse_pod_devices(DevicesAnnotation::Allocated, v).ok())
        .flatten()
        .flatten()
        .any(|d| d.uuid == gpu_id || d.uuid.starts_with(&prefix))
}

/// Switches every GPU of the first connected snapshot that offers `target`.
pub async fn switch_idle_gpus(
    bus: Bus,
    mut raw: watch::Receiver<Snapshot>,
    caches: Option<Caches>,
    target: String,
) {
    if raw.wait_for(|s| s.connected).await.is_err() {
        return;
    }
    if let Some(caches) = &caches {
        let _ = tokio::time::timeout(Duration::from_secs(30), caches.pods.wait_until_ready()).await;
    }
    let gpus = raw.borrow().gpus.clone();
    let pods = caches.map(|c| c.pods.state()).unwrap_or_default();
    for gpu in gpus {
        let offered = gpu
            .available_compute_partitions
            .iter()
            .any(|m| m.eq_ignore_ascii_case(&target));
        let missing = gpu.health == ipc::MISSING;
        if missing || !offered || gpu.compute_partition.eq_ignore_ascii_case(&target) {
            continue;
        }
        let busy = allocations_on(&pods, &gpu_id(&gpu));
        match call(&bus, &gpu.bdf, &target, busy).await {
            Ok(generation) => {
                info!(gpu = %gpu.bdf, mode = %target, generation, "compute partition switched")
            }
            Err(err) => {
                warn!(gpu = %gpu.bdf, mode = %target, "compute partition not switched: {err}")
            }
        }
    }
}

async fn call(bus: &Bus, gpu: &str, mode: &str, allocations_exist: bool) -> Result<u64, String> {
    let conn = connect(bus).await.map_err(|e| e.to_string())?;
    let node = ipc::proxy::NodeProxy::builder(&conn)
        .cache_properties(zbus::proxy::CacheProperties::No)
        .build()
        .await
        .map_err(|e| e.to_string())?;
    let call = node.set_compute_partition(gpu, mode, allocations_exist);
    tokio::time::timeout(Duration::from_secs(90), call)
        .await
        .map_err(|_| "amd-gpud did not answer within 90 s".to_owned())?
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn pod(allocated: &str, phase: &str) -> Arc<Pod> {
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p", "annotations": {ALLOCATED_KEY: allocated}},
                "status": {"phase": phase}
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_live_pod_on_the_gpu_or_its_partitions_counts() {
        let whole = pod("GPU-A,T,1,1:;", "Running");
        let part = pod("GPU-A-cpx3,T,1,1:;", "Pending");
        let done = pod("GPU-A,T,1,1:;", "Succeeded");
        assert!(allocations_on(&[whole], "GPU-A"));
        assert!(allocations_on(&[part], "GPU-A"));
        assert!(!allocations_on(&[done], "GPU-A"));
        assert!(!allocations_on(
            &[pod("GPU-AB,T,1,1:;", "Running")],
            "GPU-A"
        ));
    }
}
