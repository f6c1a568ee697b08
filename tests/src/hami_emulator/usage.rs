//! What HAMi counts as used on a node (Project-HAMi/HAMi
//! `pkg/device/initContainer.go`, `pkg/scheduler/scheduler.go` `onAddPod`,
//! `onUpdatePod`): for every non-terminal pod it placed there, its
//! `hami.io/amd-devices-allocated` entries collapsed per device.
//!
//! The collapse goes by position: entry `i` counts as an init container when
//! `i` is below the number of init containers in the pod's spec, whether or
//! not that init container asked for an AMD GPU. The annotation lists only
//! the containers that asked (docs/hami-protocol.md §3.2), so a pod whose first init
//! container is CPU-only has its first app entry counted as an init entry:
//! HAMi then counts the device as `max(init peak, app sum)` and hands the
//! difference out again. The emulator reproduces that, on purpose: the
//! plugin must hold against the scheduler as it is.
//!
//! Per device, as HAMi v2.10.0 (Project-HAMi/HAMi 4707fb02,
//! `CollapseInitContainerUsage`) does it: the init entries (sidecars among
//! them: v2.10.0 does not tell them apart) give a peak, the largest memory
//! and the largest cores of any one of them, one container; the app entries
//! add up. Used memory and cores are `max(init peak, app sum)` field by
//! field, containers `max(1 if any init entry, apps, 1)`. Once every init
//! container status shows it terminated with 0 (`AllInitContainersSucceeded`:
//! a running sidecar never has), HAMi shrinks the pod to its app entries
//! (`AppContainersOnlyDeviceUsage`): a device only init entries named is no
//! longer used.
//!
//! HAMi therefore counts a sidecar as an init peak only, while it runs
//! beside the app containers: HAMi may place a later pod on CUs a running
//! sidecar holds, and the plugin refuses that pod's container (a CU
//! conflict, docs/hami-protocol.md §7). An unmerged HAMi change (PR #2723)
//! counts sidecars beside the apps; the emulator follows the release.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{
    Grant,
    filter::{ALLOCATED_KEY, DeviceUsage, NodeDevice, Usage, VGPU_NODE_KEY, decode_devices},
};

/// The node's devices with the usage of every non-terminal pod HAMi placed on
/// `node` (`hami.io/vgpu-node`). Entries of unknown ids and pods whose
/// annotation does not decode are ignored, as HAMi does (it logs them).
pub fn node_usage<'a>(
    devices: &[NodeDevice],
    node: &str,
    pods: impl IntoIterator<Item = &'a Value>,
) -> Vec<DeviceUsage> {
    let mut out: Vec<DeviceUsage> = devices
        .iter()
        .map(|d| DeviceUsage {
            device: d.clone(),
            usage: Usage::default(),
        })
        .collect();
    for pod in pods {
        let annotations = &pod["metadata"]["annotations"];
        let phase = pod["status"]["phase"].as_str().unwrap_or("");
        if annotations[VGPU_NODE_KEY] != node || matches!(phase, "Succeeded" | "Failed") {
            continue;
        }
        let Some(Ok(entries)) = annotations[ALLOCATED_KEY].as_str().map(decode_devices) else {
            continue;
        };
        for (id, usage) in pod_usage(pod, &entries) {
            if let Some(d) = out.iter_mut().find(|d| d.device.id == id) {
                d.usage.used += usage.used;
                d.usage.mem_mib += usage.mem_mib;
                d.usage.cores += usage.cores;
            }
        }
    }
    out
}

/// Sums of one device while walking a pod's entries.
#[derive(Default)]
struct Phases {
    /// Any init entry named the device.
    init: bool,
    peak: Usage,
    apps: Usage,
}

/// One pod's use of each device it names, as HAMi v2.10.0 collapses it.
pub fn pod_usage(pod: &Value, entries: &[Vec<Grant>]) -> BTreeMap<String, Usage> {
    let init = pod["spec"]["initContainers"].as_array().map_or(0, Vec::len);
    let steady = all_init_succeeded(pod);
    let mut phases: BTreeMap<String, Phases> = BTreeMap::new();
    for (i, entry) in entries.iter().enumerate() {
        for grant in entry {
            if i < init && steady {
                continue;
            }
            let p = phases.entry(grant.id.clone()).or_default();
            if i < init {
                p.init = true;
                p.peak.mem_mib = p.peak.mem_mib.max(i64::from(grant.mem_mib));
                p.peak.cores = p.peak.cores.max(i64::from(grant.cus));
            } else {
                p.apps.used += 1;
                p.apps.mem_mib += i64::from(grant.mem_mib);
                p.apps.cores += i64::from(grant.cus);
            }
        }
    }
    phases
        .into_iter()
        .map(|(id, p)| {
            let usage = Usage {
                used: p.apps.used.max(i64::from(p.init)).max(1),
                mem_mib: p.peak.mem_mib.max(p.apps.mem_mib),
                cores: p.peak.cores.max(p.apps.cores),
            };
            (id, usage)
        })
        .collect()
}

/// HAMi's `AllInitContainersSucceeded`: the pod has init container
/// statuses and every one shows it terminated with exit code 0.
fn all_init_succeeded(pod: &Value) -> bool {
    let statuses = pod["status"]["initContainerStatuses"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    !statuses.is_empty()
        && statuses
            .iter()
            .all(|s| s["state"]["terminated"]["exitCode"].as_i64() == Some(0))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(init: Value, statuses: Value) -> Value {
        json!({"spec": {"initContainers": init, "containers": [{"name": "app"}]},
               "status": {"phase": "Pending", "initContainerStatuses": statuses}})
    }

    fn usage_of(pod: &Value, value: &str) -> Vec<(String, (i64, i64, i64))> {
        pod_usage(pod, &decode_devices(value).unwrap())
            .into_iter()
            .map(|(id, u)| (id, (u.used, u.mem_mib, u.cores)))
            .collect()
    }

    #[test]
    fn app_entries_add_up_without_init_containers() {
        let p = pod(json!([]), json!([]));
        assert_eq!(
            usage_of(&p, "A,T,100,10:;A,T,200,20:;B,T,1,1:;"),
            [("A".into(), (2, 300, 30)), ("B".into(), (1, 1, 1))]
        );
    }

    #[test]
    fn init_peak_and_app_sum_take_the_larger() {
        let init = json!([{"name": "i0", "resources": {"limits": {"amd.com/gpu": "1"}}}]);
        let p = pod(init, json!([]));
        assert_eq!(
            usage_of(&p, "A,T,500,50:;A,T,100,10:;A,T,100,10:;"),
            [("A".into(), (2, 500, 50))]
        );
    }

    #[test]
    fn a_cpu_only_init_container_hides_the_first_app_entry() {
        // The annotation lists the two AMD app containers only; the collapse
        // takes the first of them for the CPU-only init container.
        let p = pod(json!([{"name": "setup"}]), json!([]));
        assert_eq!(
            usage_of(&p, "A,T,4096,76:;A,T,4096,76:;"),
            [("A".into(), (1, 4096, 76))],
            "HAMi's miscount: 152 CUs in use, 76 counted"
        );
    }

    /// HAMi v2.10.0 on a pod with a sidecar (10 MiB), an init container
    /// (500 MiB) and an app (20 MiB): the init peak is 500 MiB, the sidecar
    /// is not added to the app; and since a running sidecar never shows
    /// terminated, the pod never shrinks while it runs.
    #[test]
    fn hami_v2_10_counts_a_sidecar_as_an_init_peak() {
        let init = json!([{"name": "side", "restartPolicy": "Always"}, {"name": "i1"}]);
        let value = "A,T,10,1:;A,T,500,50:;A,T,20,2:;";
        let p = pod(init.clone(), json!([]));
        assert_eq!(usage_of(&p, value), [("A".into(), (1, 500, 50))]);
        let side_runs = json!([
            {"name": "side", "state": {"running": {}}},
            {"name": "i1", "state": {"terminated": {"exitCode": 0}}}]);
        let p = pod(init.clone(), side_runs);
        assert_eq!(
            usage_of(&p, value),
            [("A".into(), (1, 500, 50))],
            "the sidecar runs: no shrink"
        );
        let all_done = json!([
            {"name": "side", "state": {"terminated": {"exitCode": 0}}},
            {"name": "i1", "state": {"terminated": {"exitCode": 0}}}]);
        let p = pod(init.clone(), all_done);
        assert_eq!(usage_of(&p, value), [("A".into(), (1, 20, 2))]);
        let failed = json!([{"name": "i1", "state": {"terminated": {"exitCode": 1}}}]);
        let p = pod(init, failed);
        assert_eq!(
            usage_of(&p, value),
            [("A".into(), (1, 500, 50))],
            "a failed init container does not release"
        );
    }

    /// Init entries give one container and the larger of each field, not
    /// the largest entry: 500 MiB of one, 60 cores of another.
    #[test]
    fn the_init_peak_is_taken_field_by_field() {
        let init = json!([{"name": "i0"}, {"name": "i1"}]);
        let p = pod(init, json!([]));
        assert_eq!(
            usage_of(&p, "A,T,500,10:;A,T,100,60:;A,T,20,2:;A,T,20,2:;"),
            [("A".into(), (2, 500, 60))]
        );
    }
}
