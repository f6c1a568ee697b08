//! What the real kubelet did with a pod, read back for the report: the
//! device ids its pod-resources API names per container, and the
//! CreateContainer request `recording-cri` got for each container, cut
//! down to what the device plugin put in it.

use std::{collections::HashMap, path::Path};

use proto::{
    podresources::v1::{
        ListPodResourcesRequest, ListPodResourcesResponse,
        pod_resources_lister_client::PodResourcesListerClient,
    },
    v1beta1::{CdiDevice, DeviceSpec, Mount},
};
use serde_json::Value;

use super::{
    admit::{Outcome, followed},
    node::RealNode,
};
use crate::{
    cluster::kubelet::container_env,
    hami_emulator::Placement,
    kubelet::ContainerAllocateResponse,
    node_sim::{admit::is_sidecar, overlap::Span, pods::ExamplePod, report::PodReport, vram},
};

/// What kubelet adds to every container itself (service links, its
/// `/etc/hosts`, the termination log, the ServiceAccount token): left out
/// of the report, which shows what the device plugin gave.
const KUBELET_ENV_PREFIX: &str = "KUBERNETES_";
const KUBELET_MOUNTS: [&str; 3] = [
    "/etc/hosts",
    "/dev/termination-log",
    "/var/run/secrets/kubernetes.io/serviceaccount",
];

/// Fills the containers of `report` from kubelet's pod-resources API and
/// the runtime's record, and from `outcome` when they did not start.
pub async fn record(
    node: &RealNode,
    pod: &ExamplePod,
    placement: &Placement,
    report: &mut PodReport,
    outcome: Outcome,
) {
    let ids = match list(&node.kubelet.pod_resources_socket()).await {
        Ok(list) => device_ids(&list, pod),
        Err(why) => {
            session_note(report, &format!("pod-resources: {why}"));
            HashMap::new()
        }
    };
    let created: Vec<(u64, Value)> = node
        .kubelet
        .timed_requests("CreateContainer")
        .into_iter()
        .filter(|(_, r)| {
            r["sandboxConfig"]["metadata"]["name"] == pod.name.as_str()
                && r["sandboxConfig"]["metadata"]["namespace"] == pod.namespace.as_str()
        })
        .collect();
    for (i, container) in report.containers.iter_mut().enumerate() {
        container.span = span(&created, &pod.manifest, &container.name);
        let request = created
            .iter()
            .map(|(_, r)| r)
            .find(|r| r["config"]["metadata"]["name"] == container.name.as_str());
        let kubelet_ids = ids.get(&container.name).cloned().unwrap_or_default();
        match (request, &outcome) {
            (Some(request), _) => {
                let answer = plugin_part(request);
                let follows = followed(&kubelet_ids, placement, i);
                container.record(&kubelet_ids, follows, &answer);
            }
            (None, Outcome::Refused(why)) => container.error = Some(why.clone()),
            (None, Outcome::NotStarted(why)) => {
                container.kubelet_ids = kubelet_ids;
                container.start_error = Some(why.clone());
            }
            (None, Outcome::Running) => {
                container.start_error = Some("Running, but no CreateContainer recorded".into());
            }
        }
    }
}

/// When container `name` of the pod `manifest` ran, from the runtime's
/// CreateContainer requests `created` for the pod (Unix nanoseconds): from
/// its first creation; an init container that is not a sidecar had ended
/// by the time any container after it was created (kubelet runs them one
/// after another, the app containers after the last).
fn span(created: &[(u64, Value)], manifest: &Value, name: &str) -> Span {
    let first = |names: &[&str]| {
        created
            .iter()
            .filter(|(_, r)| {
                r["config"]["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| names.contains(&n))
            })
            .map(|(at, _)| *at)
            .min()
    };
    let names = |key: &str| -> Vec<&str> {
        manifest["spec"][key]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str())
            .collect()
    };
    let (init, apps) = (names("initContainers"), names("containers"));
    let ended_by = init
        .iter()
        .position(|n| *n == name)
        .filter(|_| !is_sidecar(manifest, name))
        .and_then(|at| {
            let later: Vec<&str> = init[at + 1..].iter().chain(&apps).copied().collect();
            first(&later)
        });
    Span {
        from: first(&[name]),
        ended_by,
    }
}

/// A note on the pod's first container (the report has no field of its own).
fn session_note(report: &mut PodReport, note: &str) {
    if let Some(first) = report.containers.first_mut() {
        first.start_error.get_or_insert_with(|| note.to_owned());
    }
}

/// PreStartContainer's outcome, as the pod cgroup's `dmem.max` shows it:
/// amd-gpud wrote the pod's VRAM caps there when kubelet called it.
pub fn pre_start(cgroup: Option<&Path>, report: &mut PodReport) {
    vram::read(cgroup, report);
    let Some(cgroup) = cgroup else {
        return;
    };
    let caps = std::fs::read_to_string(cgroup.join("dmem.max")).unwrap_or_default();
    for container in &mut report.containers {
        container.pre_start = if let Some(why) = &container.start_error {
            Some(format!("failed: {why}"))
        } else if container.error.is_some() {
            None
        } else if caps.trim().is_empty() {
            Some("not called: the pod cgroup's dmem.max is empty".to_owned())
        } else {
            Some("ok: VRAM caps set through amd-gpud".to_owned())
        };
    }
}

/// Per container of `pod`, the AMD device ids kubelet assigned.
fn device_ids(list: &ListPodResourcesResponse, pod: &ExamplePod) -> HashMap<String, Vec<String>> {
    list.pod_resources
        .iter()
        .filter(|p| p.name == pod.name && p.namespace == pod.namespace)
        .flat_map(|p| &p.containers)
        .map(|c| {
            let ids = c
                .devices
                .iter()
                .filter(|d| d.resource_name.starts_with("amd.com/"))
                .flat_map(|d| d.device_ids.iter().cloned())
                .collect();
            (c.name.clone(), ids)
        })
        .collect()
}

/// kubelet's pod-resources `List`.
async fn list(socket: &Path) -> Result<ListPodResourcesResponse, String> {
    let call = async {
        let channel = proto::unix::channel(socket)
            .await
            .map_err(|e| format!("cannot connect to {}: {e}", socket.display()))?;
        PodResourcesListerClient::new(channel)
            .list(ListPodResourcesRequest {})
            .await
            .map(tonic::Response::into_inner)
            .map_err(|s| format!("List failed: {}", s.message()))
    };
    tokio::time::timeout(std::time::Duration::from_secs(10), call)
        .await
        .map_err(|_| "List: no answer within 10 s".to_owned())?
}

/// A CreateContainer request (CRI's JSON) as the Allocate answer that
/// would have produced it: its environment, mounts, devices and CDI
/// devices, without what kubelet adds to every container.
fn plugin_part(request: &Value) -> ContainerAllocateResponse {
    let config = &request["config"];
    let items = |field: &str| config[field].as_array().cloned().unwrap_or_default();
    let text = |v: &Value, field: &str| v[field].as_str().unwrap_or_default().to_owned();
    ContainerAllocateResponse {
        envs: container_env(request)
            .into_iter()
            .filter(|(k, _)| !k.starts_with(KUBELET_ENV_PREFIX))
            .collect(),
        mounts: items("mounts")
            .iter()
            .filter(|m| !KUBELET_MOUNTS.contains(&m["containerPath"].as_str().unwrap_or_default()))
            .map(|m| Mount {
                container_path: text(m, "containerPath"),
                host_path: text(m, "hostPath"),
                read_only: m["readonly"].as_bool().unwrap_or(false),
            })
            .collect(),
        devices: items("devices")
            .iter()
            .map(|d| DeviceSpec {
                container_path: text(d, "containerPath"),
                host_path: text(d, "hostPath"),
                permissions: text(d, "permissions"),
            })
            .collect(),
        cdi_devices: items("CDIDevices")
            .iter()
            .chain(items("cdiDevices").iter())
            .map(|c| CdiDevice {
                name: text(c, "name"),
            })
            .collect(),
        annotations: HashMap::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_init_container_ended_when_the_next_was_created() {
        let manifest = json!({"spec": {
            "initContainers": [{"name": "prep"}, {"name": "side", "restartPolicy": "Always"}],
            "containers": [{"name": "main"}]}});
        let create = |at: u64, name: &str| (at, json!({"config": {"metadata": {"name": name}}}));
        let created = [create(10, "prep"), create(20, "side"), create(30, "main")];
        let prep = span(&created, &manifest, "prep");
        assert_eq!((prep.from, prep.ended_by), (Some(10), Some(20)));
        let side = span(&created, &manifest, "side");
        assert_eq!(
            (side.from, side.ended_by),
            (Some(20), None),
            "a sidecar runs on"
        );
        let main = span(&created, &manifest, "main");
        assert_eq!((main.from, main.ended_by), (Some(30), None));
        let running = span(&created[..1], &manifest, "prep");
        assert_eq!(running.ended_by, None, "nothing after it yet");
    }

    #[test]
    fn kubelets_own_additions_are_left_out() {
        let request = json!({"config": {
            "envs": [{"key": "HSA_CU_MASK", "value": "0:0-75"},
                     {"key": "KUBERNETES_SERVICE_HOST", "value": "10.0.0.1"}],
            "mounts": [{"containerPath": "/etc/hosts", "hostPath": "/x"},
                       {"containerPath": "/usr/local/vgpu/libamvgpu.so",
                        "hostPath": "/h/libamvgpu.so", "readonly": true}],
            "devices": [{"containerPath": "/dev/kfd", "hostPath": "/dev/kfd",
                         "permissions": "rw"}],
            "CDIDevices": [{"name": "amd.com/gpu=0"}]}});
        let answer = plugin_part(&request);
        assert_eq!(answer.envs.len(), 1, "{:?}", answer.envs);
        assert_eq!(answer.mounts.len(), 1);
        assert!(answer.mounts[0].read_only);
        assert_eq!(answer.devices[0].permissions, "rw");
        assert_eq!(answer.cdi_devices[0].name, "amd.com/gpu=0");
    }
}
