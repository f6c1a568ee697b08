//! One pod's way onto a node of the real cluster: HAMi's Filter and Bind
//! (emulated: HAMi's scheduler cannot be had here) write the pod with
//! HAMi's annotations, the node lock and the Binding to the real API
//! server; from there the real kubelet admits it (GetPreferredAllocation
//! and Allocate), starts it (PreStartContainer, then CreateContainer in
//! `recording-cri`), and the report reads what happened: the pod's status,
//! the device ids kubelet's pod-resources API names, the CreateContainer
//! requests, the pod cgroup's `dmem.max`.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::{
    Api,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use super::{RealSession, node::RealNode, runtime};
use crate::{
    apiserver::rfc3339,
    fixture::cgroup::{CgroupDriver, add_pod},
    hami_emulator::{Placement, SCHEDULER_NAME, filter::FilterError, request::GpuPolicy},
    node_sim::{
        admit::{qos_class, rejections, unix_now},
        pods::{ExamplePod, POD_CGROUP_ANNOTATION},
        report::{ContainerReport, PodReport},
    },
};

/// The scheduler name of the pods the emulator places here, which node-sim
/// binds itself: one no scheduler serves, so that kube-scheduler
/// `hami-scheduler` (which places the pods created with kubectl, through
/// the emulator's extender) does not place them a second time between
/// their creation and node-sim's Binding, now that the Nodes are not
/// tainted. The plugin and HAMi's usage do not read it.
pub const OWN_SCHEDULER: &str = "node-sim";

/// How long kubelet gets to admit and start a pod.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Places `pod` on `node` as HAMi would, lets kubelet admit and start it,
/// and reports what every container got.
pub async fn admit(
    session: &RealSession,
    node: &RealNode,
    pod: &ExamplePod,
    policy: GpuPolicy,
) -> PodReport {
    match place(session, node, pod, policy, false).await {
        Ok(placed) => follow(session, node, pod, placed).await,
        Err(report) => *report,
    }
}

/// `--all-at-once`: every pod of `pods` placed (created and bound) before
/// any is waited for; kubelet admits each as soon as it is bound. Their
/// reports, in order.
pub async fn admit_all(
    session: &RealSession,
    node: &RealNode,
    pods: &[&ExamplePod],
    policy: GpuPolicy,
) -> Vec<PodReport> {
    let mut placed = Vec::new();
    for pod in pods {
        placed.push(place(session, node, pod, policy, true).await);
    }
    let mut reports = Vec::new();
    for (pod, placed) in pods.iter().zip(placed) {
        reports.push(match placed {
            Ok(placed) => follow(session, node, pod, placed).await,
            Err(report) => *report,
        });
    }
    reports
}

/// A pod bound to its node, before kubelet is seen to admit it.
pub struct Placed {
    report: PodReport,
    placement: Placement,
    cgroup: Option<PathBuf>,
}

/// HAMi's Filter and Bind of `pod` (the emulator's, or the real HAMi
/// scheduler's). `patient`: the emulated Bind of a pod that takes the node
/// lock waits while another pod holds it, as HAMi retries a Bind that
/// finds it taken (with `--all-at-once` kubelet may still be admitting the
/// pod bound before).
///
/// # Errors
/// The finished report of a pod HAMi did not bind.
pub async fn place(
    session: &RealSession,
    node: &RealNode,
    pod: &ExamplePod,
    policy: GpuPolicy,
    patient: bool,
) -> Result<Placed, Box<PodReport>> {
    let mut report = PodReport::on(pod, &node.name, node.mode);
    let say = |msg: &str| session.host.progress.step(&node.name, msg);
    let (placement, cgroup) = if session.hami.is_some() {
        match super::hami::schedule(session, node, pod).await {
            Ok(placed) => placed,
            Err(super::hami::NotBound(why)) => {
                say(&format!("HAMi did not bind pod {}", pod.name));
                report.reason = Some(why.clone());
                report.summary = Some(why);
                return Err(Box::new(report));
            }
        }
    } else {
        match emulated(session, node, pod, (policy, patient), &mut report).await {
            Some(placed) => placed,
            None => return Err(Box::new(report)),
        }
    };
    report.scheduled = true;
    if report.containers.is_empty() {
        for (request, grants) in placement.requests.iter().zip(&placement.grants) {
            report
                .containers
                .push(ContainerReport::new(request, grants));
        }
    }
    say(&format!("HAMi bound pod {}; kubelet admits it", pod.name));
    Ok(Placed {
        report,
        placement,
        cgroup,
    })
}

/// Waits until kubelet runs the placed pod, refuses it, or cannot start a
/// container, and reads back what every container got.
pub async fn follow(
    session: &RealSession,
    node: &RealNode,
    pod: &ExamplePod,
    placed: Placed,
) -> PodReport {
    let Placed {
        mut report,
        placement,
        cgroup,
    } = placed;
    let outcome = wait_started(session, pod).await;
    runtime::record(node, pod, &placement, &mut report, outcome).await;
    runtime::pre_start(cgroup.as_deref(), &mut report);
    finish(session, pod, &mut report).await;
    report
}

/// The emulator's Filter and Bind; `None` (with the report saying why)
/// when HAMi would not place or the Binding failed.
async fn emulated(
    session: &RealSession,
    node: &RealNode,
    pod: &ExamplePod,
    (policy, patient): (GpuPolicy, bool),
    report: &mut PodReport,
) -> Option<(Placement, Option<PathBuf>)> {
    let say = |msg: &str| session.host.progress.step(&node.name, msg);
    let placement = match filter(session, node, pod, policy).await {
        Ok(placement) => placement,
        Err(err) => {
            say(&format!("HAMi cannot place pod {}", pod.name));
            if let Err(why) = unschedulable(session, pod, &err).await {
                say(&format!("could not record that on the API server: {why}"));
            }
            report.reason = Some(err.to_string());
            report.summary = Some(err.summary());
            report.rejections = rejections(&err);
            return None;
        }
    };
    for (request, grants) in placement.requests.iter().zip(&placement.grants) {
        report
            .containers
            .push(ContainerReport::new(request, grants));
    }
    match bind(session, node, pod, &placement, patient).await {
        Ok(cgroup) => Some((placement, cgroup)),
        Err(why) => {
            for container in &mut report.containers {
                container.error = Some(format!("not bound: {why}"));
            }
            None
        }
    }
}

/// HAMi's Filter on what the real API server holds.
async fn filter(
    session: &RealSession,
    node: &RealNode,
    pod: &ExamplePod,
    policy: GpuPolicy,
) -> Result<Placement, FilterError> {
    let register = node.register(session).await.map(|r| r.to_string());
    let pods: Api<Pod> = Api::all(session.client.clone());
    let listed = pods
        .list(&ListParams::default())
        .await
        .map_err(|e| FilterError::BadPod {
            message: format!("listing the cluster's pods: {e}"),
        })?;
    let pods: Vec<Value> = listed
        .items
        .iter()
        .filter_map(|p| serde_json::to_value(p).ok())
        .collect();
    node.hami
        .place(register.as_deref(), &pods, &pod.manifest, policy)
}

/// Bind: the pod with HAMi's annotations (for [`OWN_SCHEDULER`], so that
/// no kube-scheduler places it), its pod cgroup on the fake host (made
/// by kubelet on a real node; kubelet here runs without per-pod cgroups),
/// the node lock when an app container asks for AMD GPUs (once it is free
/// when `patient`), the Binding. The pod cgroup's path, unless the example
/// asks for none.
async fn bind(
    session: &RealSession,
    node: &RealNode,
    pod: &ExamplePod,
    placement: &Placement,
    patient: bool,
) -> Result<Option<PathBuf>, String> {
    let now = unix_now();
    let mut manifest = pod.manifest.clone();
    manifest["metadata"]["namespace"] = json!(pod.namespace);
    manifest["spec"]["schedulerName"] = json!(OWN_SCHEDULER);
    for (key, value) in node.hami.bind_annotations(&placement.grants, now) {
        manifest["metadata"]["annotations"][key] = json!(value);
    }
    if !placement.grants.is_empty() {
        manifest["metadata"]["labels"]["hami.io/vgpu-node"] = json!(node.name);
    }
    let cgroup = create_with_cgroup(session, node, pod, manifest).await?;
    let pods: Api<Pod> = Api::namespaced(session.client.clone(), &pod.namespace);
    if placement.requests.iter().any(|r| !r.init) {
        let nodes: Api<Node> = Api::all(session.client.clone());
        if patient {
            lock_freed(&nodes, &node.name).await?;
        }
        let lock = format!("{},{},{}", rfc3339(now), pod.namespace, pod.name);
        let patch = json!({"metadata": {"annotations": {LOCK_KEY: lock}}});
        nodes
            .patch(&node.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| format!("taking the node lock: {e}"))?;
    }
    let binding = json!({"apiVersion": "v1", "kind": "Binding",
                         "metadata": {"name": pod.name, "namespace": pod.namespace},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": node.name}});
    pods.create_subresource::<Value, Value>("binding", &pod.name, &PostParams::default(), &binding)
        .await
        .map_err(|e| format!("binding: {e}"))?;
    Ok(cgroup)
}

/// HAMi's node lock (`docs/hami-protocol.md` §3.7).
const LOCK_KEY: &str = "hami.io/mutex.lock";

/// Waits until the plugin has released the node lock of `node`.
///
/// # Errors
/// The lock still names a pod after [`START_TIMEOUT`].
async fn lock_freed(nodes: &Api<Node>, node: &str) -> Result<(), String> {
    let start = Instant::now();
    loop {
        let stored = nodes
            .get(node)
            .await
            .map_err(|e| format!("reading Node {node}: {e}"))?;
        let annotations = stored.metadata.annotations.unwrap_or_default();
        let Some(lock) = annotations.get(LOCK_KEY) else {
            return Ok(());
        };
        if start.elapsed() > START_TIMEOUT {
            let secs = START_TIMEOUT.as_secs();
            return Err(format!("the node lock still reads {lock:?} after {secs} s"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Creates `pod` as `manifest` says, and its pod cgroup on the node's fake
/// host (kubelet makes it on a real node; here kubelet runs without
/// per-pod cgroups), unless the example asks for none: the cgroup's path.
pub(super) async fn create_with_cgroup(
    session: &RealSession,
    node: &RealNode,
    pod: &ExamplePod,
    manifest: Value,
) -> Result<Option<PathBuf>, String> {
    let object: Pod = serde_json::from_value(manifest).map_err(|e| e.to_string())?;
    let pods: Api<Pod> = Api::namespaced(session.client.clone(), &pod.namespace);
    let created = pods
        .create(&PostParams::default(), &object)
        .await
        .map_err(|e| format!("creating the pod: {e}"))?;
    let uid = created.metadata.uid.unwrap_or_default();
    if pod.manifest["metadata"]["annotations"][POD_CGROUP_ANNOTATION] == "absent" {
        return Ok(None);
    }
    let qos = qos_class(&pod.manifest);
    add_pod(&node.host.root, CgroupDriver::Systemd, qos, &uid)
        .map(Some)
        .map_err(|e| format!("making the pod cgroup: {e}"))
}

/// How kubelet left the pod.
#[derive(Debug)]
pub enum Outcome {
    Running,
    /// Admission refused it (Failed, `UnexpectedAdmissionError`).
    Refused(String),
    /// Admitted, but a container did not start: kubelet's reason.
    NotStarted(String),
}

/// Waits until kubelet runs the pod, refuses it, or reports a container
/// that cannot start.
async fn wait_started(session: &RealSession, pod: &ExamplePod) -> Outcome {
    let pods: Api<Pod> = Api::namespaced(session.client.clone(), &pod.namespace);
    let start = Instant::now();
    let mut last = String::from("no status yet");
    while start.elapsed() < START_TIMEOUT {
        if let Ok(stored) = pods.get(&pod.name).await {
            let status = stored.status.unwrap_or_default();
            match status.phase.as_deref() {
                Some("Running") => return Outcome::Running,
                Some("Failed") => {
                    let reason = status.reason.unwrap_or_default();
                    let message = status.message.unwrap_or_default();
                    return Outcome::Refused(format!("{reason}: {message}"));
                }
                _ => {}
            }
            let statuses = status.init_container_statuses.into_iter().flatten();
            let statuses = statuses.chain(status.container_statuses.into_iter().flatten());
            for container in statuses {
                let waiting = container.state.and_then(|s| s.waiting);
                if let Some(w) = waiting.filter(|w| w.reason.as_deref().is_some_and(is_error)) {
                    let message = w.message.unwrap_or_default();
                    let reason = w.reason.unwrap_or_default();
                    return Outcome::NotStarted(format!("{}: {reason}: {message}", container.name));
                }
            }
            last = format!("phase {:?}", status.phase);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Outcome::NotStarted(format!(
        "not Running within {} s ({last})",
        START_TIMEOUT.as_secs()
    ))
}

/// kubelet's waiting reasons for a container that failed to start
/// (`CreateContainerConfigError`, `RunContainerError`, ...).
fn is_error(reason: &str) -> bool {
    reason.ends_with("Error") || reason.ends_with("BackOff")
}

/// What the plugin wrote on the pod, as the report keeps it.
async fn finish(session: &RealSession, pod: &ExamplePod, report: &mut PodReport) {
    let pods: Api<Pod> = Api::namespaced(session.client.clone(), &pod.namespace);
    let Ok(stored) = pods.get(&pod.name).await else {
        return;
    };
    let annotations = stored.metadata.annotations.unwrap_or_default();
    let text = |key: &str| annotations.get(key).cloned();
    report.bind_phase = text("hami.io/bind-phase");
    report.devices_allocated = text("hami.io/amd-devices-allocated");
    report.cu_allocated =
        text("hami.io/amd-cu-allocated").and_then(|v| serde_json::from_str(&v).ok());
    report.uid = stored.metadata.uid;
}

/// HAMi leaves the pod Pending, unbound, with a FailedScheduling Event.
async fn unschedulable(
    session: &RealSession,
    pod: &ExamplePod,
    err: &FilterError,
) -> Result<(), String> {
    let mut manifest = pod.manifest.clone();
    manifest["metadata"]["namespace"] = json!(pod.namespace);
    manifest["spec"]["schedulerName"] = json!(OWN_SCHEDULER);
    let object: Pod = serde_json::from_value(manifest).map_err(|e| e.to_string())?;
    let pods: Api<Pod> = Api::namespaced(session.client.clone(), &pod.namespace);
    pods.create(&PostParams::default(), &object)
        .await
        .map_err(|e| format!("creating the pod: {e}"))?;
    let event = json!({"apiVersion": "v1", "kind": "Event",
        "metadata": {"name": format!("{}.failed-scheduling", pod.name),
                     "namespace": pod.namespace},
        "involvedObject": {"kind": "Pod", "name": pod.name, "namespace": pod.namespace},
        "reason": "FailedScheduling", "type": "Warning", "message": err.to_string(),
        "source": {"component": SCHEDULER_NAME}});
    let event: Event = serde_json::from_value(event).map_err(|e| e.to_string())?;
    let events: Api<Event> = Api::namespaced(session.client.clone(), &pod.namespace);
    events
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
        .map_err(|e| format!("recording the FailedScheduling Event: {e}"))
}

/// Whether kubelet's ids are slots of the GPUs HAMi granted container
/// `container`, one per grant. kubelet keeps a container's devices as a
/// set: its pod-resources API lists them in no particular order.
pub fn followed(ids: &[String], placement: &Placement, container: usize) -> bool {
    let Some(grants) = placement.grants.get(container) else {
        return false;
    };
    let mut gpus: Vec<&str> = ids
        .iter()
        .filter_map(|id| id.rsplit_once('#').map(|(gpu, _)| gpu))
        .collect();
    let mut granted: Vec<&str> = grants.iter().map(|g| g.id.as_str()).collect();
    gpus.sort_unstable();
    granted.sort_unstable();
    ids.len() == gpus.len() && gpus == granted
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hami_emulator::Grant;

    #[test]
    fn kubelets_ids_follow_in_any_order() {
        let g = |id: &str| Grant {
            id: id.into(),
            device_type: "T".into(),
            mem_mib: 1,
            cus: 1,
        };
        let placement = Placement {
            requests: Vec::new(),
            grants: vec![vec![g("A"), g("B")]],
            dropped: Vec::new(),
        };
        let ids = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(followed(&ids(&["B#7", "A#9"]), &placement, 0));
        assert!(!followed(&ids(&["A#7", "A#9"]), &placement, 0));
        assert!(!followed(&ids(&["A#7"]), &placement, 0));
        assert!(!followed(&ids(&["A#7", "B#1"]), &placement, 1));
    }
}
