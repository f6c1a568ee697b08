//! `COMPUTE_PARTITION=<mode>`: at start, ask amd-gpud to switch every idle
//! GPU that offers the mode. amd-gpud owns the switch and refuses a GPU in
//! use; the plugin adds what only it knows: whether pods on this node hold
//! allocations on the GPU (from the watch cache, and from kubelet's
//! pod-resources API). No GPU is switched before both can be trusted (the
//! pods listed, the watches answering, pod-resources answering): a view
//! without them would call a GPU that a running pod holds idle. The plugin
//! says why it waits (log, a Warning Event) and switches once they can.

use std::{path::PathBuf, sync::Arc, time::Duration};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    gpud::{Bus, SessionError, connect, node_proxy},
    hami::{ALLOCATED_KEY, DevicesAnnotation, parse_pod_devices},
    inventory::Snapshot,
    inventory::ids::Aliases,
    inventory::partition::{self, MODE_ANNOTATION, OperatingMode},
    kube::{CALL_TIMEOUT, Caches, Events, Regarding},
    vram::{PodResourcesError, owners::list_pod_resources},
};

/// The Event reasons: the switch waits for a trustworthy view of
/// allocations (Warning), and goes on once it has one (Normal).
pub(crate) const DEFERRED: &str = "PartitionSwitchDeferred";
pub(crate) const RESUMED: &str = "PartitionSwitchResumed";

/// How often a view that cannot be trusted yet is looked at again.
const RECHECK: Duration = Duration::from_secs(2);

/// Where the switch learns which GPUs pods hold.
#[derive(Clone, Default)]
pub(crate) struct Sources {
    /// The watch caches (`None` with `--kube none`).
    pub(crate) caches: Option<Caches>,
    /// Kubelet's pod-resources socket (`None` when turned off).
    pub(crate) pod_resources: Option<PathBuf>,
    /// The resource whose devices pod-resources names (`amd.com/gpu`).
    pub(crate) resource_name: String,
    pub(crate) events: Option<Events>,
    /// `--split-count`, to tell the GPU HAMi's (up to v2.9)
    /// `<node>-AMDGPU-<n>` in a pod's record names.
    pub(crate) split_count: u32,
}

/// Every allocation the node's pods hold, from a view that can be trusted.
#[derive(Debug, Default)]
pub(crate) struct Allocations {
    pods: Vec<Arc<Pod>>,
    /// Device ids (`<gpu id>#<slot>`) kubelet gave containers.
    devices: Vec<String>,
}

impl Allocations {
    /// Who holds AMD devices, if anyone: the live pods HAMi allocated
    /// devices for (the first few named), and the devices kubelet gave
    /// containers.
    pub(crate) fn holders(&self) -> Option<String> {
        let pods: Vec<String> = self
            .pods
            .iter()
            .filter(|p| live(p) && holds_devices(p))
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        let mut parts = Vec::new();
        if !pods.is_empty() {
            let shown: Vec<&str> = pods.iter().take(5).map(String::as_str).collect();
            let more = pods.len().saturating_sub(shown.len());
            let tail = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            parts.push(format!("pods {}{tail}", shown.join(", ")));
        }
        if !self.devices.is_empty() {
            parts.push(format!(
                "{} device(s) kubelet gave containers",
                self.devices.len()
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }

    /// Whether the GPU `id` (or one of its partitions) is held; a pod's
    /// record under an older name of the GPU (`aliases`) counts.
    fn on(&self, id: &str, aliases: &Aliases) -> bool {
        let prefix = format!("{id}-");
        let held = |d: &String| {
            let gpu = d.split('#').next().unwrap_or_default();
            gpu == id || gpu.starts_with(&prefix)
        };
        allocations_on(&self.pods, id, aliases) || self.devices.iter().any(held)
    }
}

/// The operating mode: the node annotation when set, else the flag.
pub(crate) async fn operating_mode(
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

fn live(pod: &Pod) -> bool {
    !matches!(
        pod.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Succeeded" | "Failed")
    )
}

/// Whether HAMi's record of `pod` grants it any device.
fn holds_devices(pod: &Pod) -> bool {
    pod.annotations()
        .get(ALLOCATED_KEY)
        .and_then(|v| parse_pod_devices(DevicesAnnotation::Allocated, v).ok())
        .is_some_and(|c| c.iter().any(|d| !d.is_empty()))
}

/// Whether a live pod holds an allocation on the GPU whose id is `gpu_id`
/// (the GPU itself, or one of its partitions `<gpu_id>-<mode><n>`), under
/// its current id or an older name `aliases` resolves (the Go plugin's,
/// HAMi's up to v2.9).
pub(crate) fn allocations_on(
    pods: &[std::sync::Arc<Pod>],
    gpu_id: &str,
    aliases: &Aliases,
) -> bool {
    let prefix = format!("{gpu_id}-");
    pods.iter()
        .filter(|p| live(p))
        .filter_map(|p| p.annotations().get(ALLOCATED_KEY))
        .filter_map(|v| parse_pod_devices(DevicesAnnotation::Allocated, v).ok())
        .flatten()
        .flatten()
        .map(|d| aliases.current_or_same(&d.uuid))
        .any(|id| id == gpu_id || id.starts_with(&prefix))
}

/// Switches every GPU of the first connected snapshot that offers `target`,
/// once the view of allocations can be trusted.
pub(crate) async fn switch_idle_gpus(
    bus: Bus,
    mut raw: watch::Receiver<Snapshot>,
    sources: Sources,
    target: String,
) {
    if raw.wait_for(|s| s.connected).await.is_err() {
        return;
    }
    let held = trusted(&sources, &target).await;
    let (gpus, aliases) = {
        let snapshot = raw.borrow();
        let aliases = Aliases::of(&snapshot).with_hami_indices(&snapshot, sources.split_count);
        (snapshot.devices().to_vec(), aliases)
    };
    for gpu in gpus {
        let offered = gpu.available_compute_modes.iter().any(|m| m.is(&target));
        let missing = gpu.health == ipc::Health::Missing;
        if missing || !offered || gpu.compute_mode_str().eq_ignore_ascii_case(&target) {
            continue;
        }
        let busy = held.on(&gpu.id, &aliases);
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

/// Waits until [`allocations`] can be had, saying why it waits (each new
/// reason logged, the first one in the Events).
pub(crate) async fn trusted(sources: &Sources, target: &str) -> Allocations {
    let mut deferred: Option<(tokio::time::Instant, String)> = None;
    let mut last = String::new();
    loop {
        let why = match allocations(sources).await {
            Ok(held) => {
                if let Some((since, why)) = deferred {
                    let note = format!(
                        "switching idle GPUs to {target} after {:.0?}: the view of allocations \
                         can be trusted now (it could not: {why})",
                        since.elapsed()
                    );
                    info!("{note}");
                    event(sources, false, RESUMED, note);
                }
                return held;
            }
            Err(why) => why.to_string(),
        };
        if why != last {
            let note = format!(
                "no GPU is switched to {target} yet: {why}; without it a GPU a running pod \
                 holds could look idle"
            );
            warn!("{note}");
            if deferred.is_none() {
                event(sources, true, DEFERRED, note);
                deferred = Some((tokio::time::Instant::now(), why.clone()));
            }
            last = why;
        }
        tokio::time::sleep(RECHECK).await;
    }
}

/// A Node Event of the start-up switch.
fn event(sources: &Sources, warning: bool, reason: &str, note: String) {
    node_event(sources, warning, (reason, "PartitionSwitch"), note);
}

/// A Node Event `(reason, action)`, when there is an API server to send it to.
pub(crate) fn node_event(sources: &Sources, warning: bool, why: (&str, &str), note: String) {
    let (Some(events), Some(caches)) = (&sources.events, &sources.caches) else {
        return;
    };
    let regarding = Regarding::node_of(caches);
    let (reason, action) = why;
    if warning {
        events.warning(&regarding, reason, action, note);
    } else {
        events.normal(&regarding, reason, action, note);
    }
}

/// Why the allocations on this node cannot be trusted now.
#[derive(Debug, thiserror::Error)]
pub(crate) enum AllocationsError {
    #[error(
        "neither the Kubernetes API (--kube none) nor kubelet's pod-resources API \
         (--pod-resources-socket none) tells which GPUs pods hold"
    )]
    NoSource,
    #[error(
        "the watch of the pods on node {node} has not listed them (the API server does not answer)"
    )]
    NotListed { node: String },
    #[error("the API server's watches fail: the cached pods may be stale")]
    WatchesFail,
    #[error("kubelet's pod-resources API ({}): {source}", path.display())]
    PodResources {
        path: PathBuf,
        #[source]
        source: PodResourcesError,
    },
}

/// The allocations on this node, or why they cannot be trusted now.
pub(crate) async fn allocations(sources: &Sources) -> Result<Allocations, AllocationsError> {
    if sources.caches.is_none() && sources.pod_resources.is_none() {
        return Err(AllocationsError::NoSource);
    }
    let mut held = Allocations::default();
    if let Some(caches) = &sources.caches {
        let listed = tokio::time::timeout(RECHECK, caches.pods.wait_until_ready()).await;
        if !matches!(listed, Ok(Ok(()))) {
            return Err(AllocationsError::NotListed {
                node: caches.node_name.clone(),
            });
        }
        if !caches.connected() {
            return Err(AllocationsError::WatchesFail);
        }
        held.pods = caches.pods.state();
    }
    if let Some(path) = &sources.pod_resources {
        let list =
            list_pod_resources(path)
                .await
                .map_err(|source| AllocationsError::PodResources {
                    path: path.clone(),
                    source,
                })?;
        held.devices = list
            .pod_resources
            .iter()
            .flat_map(|p| &p.containers)
            .flat_map(|c| &c.devices)
            .filter(|d| d.resource_name == sources.resource_name)
            .flat_map(|d| d.device_ids.iter().cloned())
            .collect();
    }
    Ok(held)
}

/// How long amd-gpud has to switch a GPU's compute partition.
const SWITCH_TIMEOUT: Duration = Duration::from_secs(90);

/// Asks amd-gpud to switch `gpu` to `mode`; its new inventory generation.
async fn call(
    bus: &Bus,
    gpu: &str,
    mode: &str,
    allocations_exist: bool,
) -> Result<u64, SessionError> {
    let conn = connect(bus).await?;
    let node = node_proxy(&conn).await?;
    let call = node.set_compute_partition(gpu, mode, allocations_exist);
    Ok(tokio::time::timeout(SWITCH_TIMEOUT, call)
        .await
        .map_err(|_| SessionError::Timeout(SWITCH_TIMEOUT))??)
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
    fn a_device_kubelet_gave_a_container_counts() {
        let held = Allocations {
            pods: vec![],
            devices: vec!["GPU-A#3".into(), "GPU-B-cpx1#0".into()],
        };
        let none = Aliases::default();
        assert!(held.on("GPU-A", &none) && held.on("GPU-B", &none));
        assert!(!held.on("GPU-AB", &none) && !held.on("GPU-C", &none));
    }

    #[test]
    fn a_live_pod_on_the_gpu_or_its_partitions_counts() {
        let whole = pod("GPU-A,T,1,1:;", "Running");
        let part = pod("GPU-A-cpx3,T,1,1:;", "Pending");
        let done = pod("GPU-A,T,1,1:;", "Succeeded");
        let none = Aliases::default();
        assert!(allocations_on(&[whole], "GPU-A", &none));
        assert!(allocations_on(&[part], "GPU-A", &none));
        assert!(!allocations_on(&[done], "GPU-A", &none));
        assert!(!allocations_on(
            &[pod("GPU-AB,T,1,1:;", "Running")],
            "GPU-A",
            &none
        ));
    }

    /// A pod HAMi up to v2.9 placed holds its GPU under `<node>-AMDGPU-<n>`
    /// (10 slots a GPU): the switch must count it as held.
    #[test]
    fn a_pod_placed_under_hamis_old_ids_holds_its_gpu() {
        let gpus = [
            crate::testutil::mi300x("0000:05:00.0", "GPU-A"),
            crate::testutil::mi300x("0000:15:00.0", "GPU-B"),
        ];
        let node = Snapshot::from_gpud(&gpus, Default::default(), ipc::DmemBackend::default());
        let aliases = Aliases::of(&node).with_hami_indices(&node, 10);
        let old = [pod("node-1-AMDGPU-13,AMDGPU,1024,0:;", "Running")];
        assert!(allocations_on(&old, "GPU-B", &aliases));
        assert!(!allocations_on(&old, "GPU-A", &aliases));
        assert!(!allocations_on(&old, "GPU-B", &Aliases::default()));
    }
}
