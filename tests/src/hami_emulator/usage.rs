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
//! Per device: a sidecar (an init container with `restartPolicy: Always`)
//! joins the running set for good; another init entry raises the peak to
//! sidecars + itself; app entries add up. Used memory and cores are
//! `max(peak, sidecars + apps)`, containers `max(peak, sidecars + apps, 1)`.
//! Once every non-sidecar init container has succeeded, HAMi shrinks the pod
//! to its steady state: init entries no longer count.

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

/// Running sums of one device while walking a pod's entries.
#[derive(Default)]
struct Phases {
    sidecars: Usage,
    peak: Usage,
    apps: Usage,
}

fn add(to: &mut Usage, grant: &Grant) {
    to.used += 1;
    to.mem_mib += i64::from(grant.mem_mib);
    to.cores += i64::from(grant.cus);
}

fn raise(peak: &mut Usage, with: Usage) {
    peak.used = peak.used.max(with.used);
    peak.mem_mib = peak.mem_mib.max(with.mem_mib);
    peak.cores = peak.cores.max(with.cores);
}

/// One pod's use of each device it names, as HAMi collapses it.
pub fn pod_usage(pod: &Value, entries: &[Vec<Grant>]) -> BTreeMap<String, Usage> {
    let init = pod["spec"]["initContainers"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let sidecar = |i: usize| init.get(i).is_some_and(|c| c["restartPolicy"] == "Always");
    let steady = init_released(pod, init);
    let mut phases: BTreeMap<String, Phases> = BTreeMap::new();
    for (i, entry) in entries.iter().enumerate() {
        for grant in entry {
            let p = phases.entry(grant.id.clone()).or_default();
            if i < init.len() && sidecar(i) {
                add(&mut p.sidecars, grant);
                raise(&mut p.peak, p.sidecars);
            } else if i < init.len() {
                if steady {
                    continue;
                }
                let mut with = p.sidecars;
                add(&mut with, grant);
                raise(&mut p.peak, with);
            } else {
                add(&mut p.apps, grant);
            }
        }
    }
    phases
        .into_iter()
        .map(|(id, p)| {
            let running = Usage {
                used: p.sidecars.used + p.apps.used,
                mem_mib: p.sidecars.mem_mib + p.apps.mem_mib,
                cores: p.sidecars.cores + p.apps.cores,
            };
            let mut total = if steady { Usage::default() } else { p.peak };
            raise(&mut total, running);
            if !steady {
                total.used = total.used.max(1);
            }
            (id, total)
        })
        .collect()
}

/// Whether every non-sidecar init container has terminated with status 0
/// (HAMi's `AllNonSidecarInitContainersSucceeded`), so that the pod counts
/// at its steady state. A pod without such init containers never shrinks.
fn init_released(pod: &Value, init: &[Value]) -> bool {
    let statuses = pod["status"]["initContainerStatuses"]
        .as_array()
        .map_or(&[][..], Vec::as_slice);
    let mut plain = init.iter().filter(|c| c["restartPolicy"] != "Always");
    let mut any = false;
    let all = plain.all(|c| {
        any = true;
        statuses.iter().any(|s| {
            s["name"] == c["name"] && s["state"]["terminated"]["exitCode"].as_i64() == Some(0)
        })
    });
    any && all
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

    #[test]
    fn sidecars_stay_and_finished_init_containers_leave() {
        let init = json!([{"name": "side", "restartPolicy": "Always"}, {"name": "i1"}]);
        let p = pod(init.clone(), json!([]));
        assert_eq!(
            usage_of(&p, "A,T,10,1:;A,T,500,50:;A,T,20,2:;"),
            [("A".into(), (2, 510, 51))]
        );
        let done = json!([{"name": "i1", "state": {"terminated": {"exitCode": 0}}}]);
        let p = pod(init.clone(), done);
        assert_eq!(
            usage_of(&p, "A,T,10,1:;A,T,500,50:;A,T,20,2:;"),
            [("A".into(), (2, 30, 3))]
        );
        let failed = json!([{"name": "i1", "state": {"terminated": {"exitCode": 1}}}]);
        let p = pod(init, failed);
        assert_eq!(
            usage_of(&p, "A,T,10,1:;A,T,500,50:;A,T,20,2:;"),
            [("A".into(), (2, 510, 51))],
            "a failed init container does not release"
        );
    }
}
