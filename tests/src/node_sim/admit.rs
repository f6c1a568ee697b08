//! One pod's way onto a node: HAMi's Filter and Bind (emulated), then what
//! kubelet does at admission and start: GetPreferredAllocation and Allocate
//! per AMD container, init containers first, then the pod cgroup and
//! PreStartContainer when the plugin asks for it.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use serde_json::{Value, json};

use super::{
    Session,
    node::{self, SimNode},
    picture::labels,
    pods::{ExamplePod, POD_CGROUP_ANNOTATION},
    report::{ContainerReport, PodReport, Rejection},
};
use crate::{
    apiserver::Kind,
    fixture::cgroup::{CgroupDriver, QosClass, add_pod},
    hami_emulator::{
        Grant, Placement,
        filter::{FilterError, NodeDevice},
        request::GpuPolicy,
    },
    kubelet::ContainerAllocateResponse,
};

/// How long the plugin's caches get to see a freshly bound pod.
const HINT_TIMEOUT: Duration = Duration::from_secs(5);

/// Schedules `pod` on `node` and admits it; what happened.
pub async fn admit(
    session: &Session,
    node: &mut SimNode,
    pod: &ExamplePod,
    policy: GpuPolicy,
) -> PodReport {
    match schedule(session, node, pod, policy, true) {
        Ok(bound) => kubelet_admits(session, node, pod, bound).await,
        Err(report) => *report,
    }
}

/// A pod HAMi bound to a node, not yet admitted by its kubelet.
pub struct Bound {
    pub report: PodReport,
    pub placement: Placement,
}

/// HAMi's Filter and Bind of `pod` on `node`: the pod bound (or, unless
/// `binding`, stopped short of the Binding, holding the node lock when it
/// takes one), or the report of a pod HAMi cannot place (left Pending,
/// with its Event).
///
/// # Errors
/// The finished report when HAMi cannot place the pod.
pub fn schedule(
    session: &Session,
    node: &SimNode,
    pod: &ExamplePod,
    policy: GpuPolicy,
    binding: bool,
) -> Result<Bound, Box<PodReport>> {
    let mut report = PodReport::new(pod, node);
    let (api, now) = (&session.api, unix_now());
    let placed = if binding {
        node.hami.schedule(api, &pod.manifest, now, policy)
    } else {
        node.hami
            .schedule_before_binding(api, &pod.manifest, now, policy)
    };
    let placement = match placed {
        Ok(placement) => placement,
        Err(err) => {
            unschedulable(session, pod, &err);
            session
                .host
                .progress
                .step(&node.name, &format!("HAMi cannot place pod {}", pod.name));
            report.reason = Some(err.to_string());
            report.summary = Some(err.summary());
            report.rejections = rejections(&err);
            return Err(Box::new(report));
        }
    };
    report.scheduled = true;
    let labels = labels(&devices(node::register(session, &node.name).as_ref()));
    let devices: Vec<&str> = placement
        .grants
        .iter()
        .flatten()
        .map(|g| labels.get(&g.id).map_or(g.id.as_str(), String::as_str))
        .collect();
    session.host.progress.step(
        &node.name,
        &format!("HAMi placed pod {} on {}", pod.name, devices.join(", ")),
    );
    Ok(Bound { report, placement })
}

/// What kubelet does with a pod bound to it: Allocate per AMD container
/// (init containers first), then the pod cgroup and PreStartContainer.
pub async fn kubelet_admits(
    session: &Session,
    node: &mut SimNode,
    pod: &ExamplePod,
    bound: Bound,
) -> PodReport {
    let Bound {
        mut report,
        placement,
    } = bound;
    let mut allocated = Vec::new();
    let mut reusable = Vec::new();
    for (request, grants) in placement.requests.iter().zip(&placement.grants) {
        let mut container = ContainerReport::new(request, grants);
        match allocate(node, grants, &reusable).await {
            Ok((ids, followed, answer)) => {
                container.record(&ids, followed, &answer);
                let sidecar = request.init && is_sidecar(&pod.manifest, &request.container);
                reuse(&mut reusable, &ids, request.init && !sidecar);
                allocated.push(ids);
            }
            Err(err) => container.error = Some(err),
        }
        let failed = container.error.is_some();
        report.containers.push(container);
        if failed {
            break;
        }
    }
    if report.containers.iter().all(|c| c.error.is_none()) {
        start_containers(session, node, pod, &allocated, &mut report).await;
    }
    finish(session, pod, &mut report);
    report
}

/// Kubelet's device manager for one container: devices an earlier init
/// container of the pod left reusable first (`devicesToReuse`, without
/// asking the plugin when they are enough), then GetPreferredAllocation for
/// the rest (until it names the GPUs HAMi chose, which it does once the
/// plugin's watch has seen the pod), then Allocate.
async fn allocate(
    node: &mut SimNode,
    grants: &[Grant],
    reusable: &[String],
) -> Result<(Vec<String>, bool, ContainerAllocateResponse), String> {
    let reused: Vec<String> = reusable.iter().take(grants.len()).cloned().collect();
    let (ids, followed) = if reused.len() == grants.len() {
        let followed = follows(&reused, grants);
        (reused, followed)
    } else {
        choose(node, grants, reused).await
    };
    let answer = node
        .kubelet
        .allocate(ids.clone())
        .await
        .map_err(|status| format!("Allocate: {}", status.message()))?;
    node.used.extend(ids.iter().cloned());
    Ok((ids, followed, answer))
}

/// Kubelet's choice of ids beyond the `reused` ones (which it must
/// include): the plugin's preference once it follows HAMi, else the first
/// free slots of the granted GPUs; whether the preference was followed.
async fn choose(node: &SimNode, grants: &[Grant], reused: Vec<String>) -> (Vec<String>, bool) {
    let free: Vec<String> = node
        .kubelet
        .devices()
        .into_iter()
        .filter(|d| d.health == "Healthy" && !node.used.contains(&d.id))
        .map(|d| d.id)
        .collect();
    let available: Vec<String> = reused.iter().cloned().chain(free.iter().cloned()).collect();
    let size = i32::try_from(grants.len()).unwrap_or(i32::MAX);
    let start = Instant::now();
    while start.elapsed() < HINT_TIMEOUT {
        let answer = node
            .kubelet
            .preferred_allocation(available.clone(), reused.clone(), size)
            .await;
        if let Ok(answer) = answer
            && follows(&answer, grants)
        {
            return (answer, true);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let rest = first_slots(&free, &grants[reused.len()..]);
    (reused.into_iter().chain(rest).collect(), false)
}

/// Kubelet's `devicesToReuse` after a container got `ids`: an init
/// container's devices are added (the next containers of the pod take them
/// first); a sidecar's or an app container's are no longer reusable.
fn reuse(reusable: &mut Vec<String>, ids: &[String], init: bool) {
    if init {
        for id in ids {
            if !reusable.contains(id) {
                reusable.push(id.clone());
            }
        }
    } else {
        reusable.retain(|id| !ids.contains(id));
    }
}

/// Whether init container `name` of `manifest` is a sidecar
/// (`restartPolicy: Always`: it runs beside the app containers).
pub fn is_sidecar(manifest: &Value, name: &str) -> bool {
    manifest["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["name"] == name && c["restartPolicy"] == "Always")
}

/// Whether kubelet device ids `ids` are slots of the granted GPUs, in order.
fn follows(ids: &[String], grants: &[Grant]) -> bool {
    ids.len() == grants.len()
        && ids
            .iter()
            .zip(grants)
            .all(|(id, g)| id.rsplit_once('#').is_some_and(|(gpu, _)| gpu == g.id))
}

/// Kubelet's ids when the plugin gave no usable preference: the first free
/// slot of each granted GPU.
fn first_slots(available: &[String], grants: &[Grant]) -> Vec<String> {
    let mut ids: Vec<String> = Vec::new();
    for grant in grants {
        if let Some(id) = available.iter().find(|id| {
            !ids.contains(id) && id.rsplit_once('#').is_some_and(|(gpu, _)| gpu == grant.id)
        }) {
            ids.push(id.clone());
        }
    }
    ids
}

/// Kubelet starting the containers: the pod cgroup appears, then
/// PreStartContainer per container when the plugin asked for it (the plugin
/// has amd-gpud cap the pod's VRAM in the cgroup's `dmem.max`).
async fn start_containers(
    session: &Session,
    node: &SimNode,
    pod: &ExamplePod,
    allocated: &[Vec<String>],
    report: &mut PodReport,
) {
    let wanted = node
        .kubelet
        .options()
        .await
        .is_ok_and(|o| o.pre_start_required);
    let stored = session.api.get(Kind::Pod, &pod.namespace, &pod.name);
    let uid = stored.as_ref().and_then(|p| p["metadata"]["uid"].as_str());
    let (true, Some(uid)) = (wanted, uid) else {
        return;
    };
    let annotations = &pod.manifest["metadata"]["annotations"];
    let cgroup = if annotations[POD_CGROUP_ANNOTATION] == "absent" {
        Ok(PathBuf::new())
    } else {
        add_pod(
            &node.root,
            CgroupDriver::Systemd,
            qos_class(&pod.manifest),
            uid,
        )
    };
    for (ids, container) in allocated.iter().zip(report.containers.iter_mut()) {
        let outcome = match &cgroup {
            Err(e) => Err(format!("not called: the pod cgroup could not be made: {e}")),
            Ok(_) => match node.kubelet.pre_start(ids.clone()).await {
                Ok(()) => Ok("ok: VRAM caps set through amd-gpud".to_owned()),
                Err(status) => Err(format!("failed: {}", status.message())),
            },
        };
        if let Err(why) = &outcome {
            session.host.progress.step(
                &node.name,
                &format!(
                    "container {} of pod {} did not start: PreStartContainer {why}",
                    container.name, pod.name
                ),
            );
            container.start_error = Some(format!("PreStartContainer {why}"));
        }
        container.pre_start = Some(outcome.unwrap_or_else(|why| why));
    }
    let made = cgroup.ok().filter(|path| !path.as_os_str().is_empty());
    super::vram::read(made.as_deref(), report);
    if let Some(cgroup) = &made {
        let register = super::node::register(session, &node.name).unwrap_or_default();
        let started = super::monitor::run_processes(&node.root, &register, cgroup, report);
        if let Err(e) = started {
            let what = format!("pod {}: no KFD process written: {e}", pod.name);
            session.host.progress.step(&node.name, &what);
        }
    }
}

/// Kubernetes' QoS class of a pod manifest (cpu and memory only).
pub fn qos_class(manifest: &Value) -> QosClass {
    let containers: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .filter_map(|k| manifest["spec"][k].as_array())
        .flatten()
        .collect();
    let amount = |c: &Value, kind: &str, res: &str| c["resources"][kind][res].clone();
    let any = containers.iter().any(|c| {
        ["cpu", "memory"]
            .iter()
            .any(|r| !amount(c, "limits", r).is_null() || !amount(c, "requests", r).is_null())
    });
    let guaranteed = containers.iter().all(|c| {
        ["cpu", "memory"].iter().all(|r| {
            let limit = amount(c, "limits", r);
            let request = amount(c, "requests", r);
            !limit.is_null() && (request.is_null() || request == limit)
        })
    });
    match (any, guaranteed) {
        (false, _) => QosClass::BestEffort,
        (true, true) => QosClass::Guaranteed,
        (true, false) => QosClass::Burstable,
    }
}

/// The pod as kubelet leaves it (Running, or Failed with kubelet's
/// `UnexpectedAdmissionError`), and what the plugin wrote on it.
fn finish(session: &Session, pod: &ExamplePod, report: &mut PodReport) {
    let Some(mut stored) = session.api.get(Kind::Pod, &pod.namespace, &pod.name) else {
        return;
    };
    let failed = report.containers.iter().find_map(|c| c.error.clone());
    stored["status"] = match &failed {
        None => json!({"phase": "Running"}),
        Some(message) => json!({"phase": "Failed", "reason": "UnexpectedAdmissionError",
                                 "message": message}),
    };
    let annotations = &stored["metadata"]["annotations"];
    let text = |key: &str| annotations[key].as_str().map(str::to_owned);
    report.bind_phase = text("hami.io/bind-phase");
    report.devices_allocated = text("hami.io/amd-devices-allocated");
    report.cu_allocated =
        text("hami.io/amd-cu-allocated").and_then(|v| serde_json::from_str(&v).ok());
    report.uid = stored["metadata"]["uid"].as_str().map(str::to_owned);
    session.api.put_pod(stored);
}

/// HAMi leaves the pod Pending, unbound, with a FailedScheduling event.
fn unschedulable(session: &Session, pod: &ExamplePod, err: &FilterError) {
    let mut manifest = pod.manifest.clone();
    manifest["metadata"]["namespace"] = json!(pod.namespace);
    manifest["status"] = json!({"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": err.to_string()}]});
    session.api.put_pod(manifest);
    session.api.put(
        Kind::Event,
        json!({"apiVersion": "v1", "kind": "Event",
               "metadata": {"name": format!("{}.failed-scheduling", pod.name),
                            "namespace": pod.namespace},
               "involvedObject": {"kind": "Pod", "name": pod.name, "namespace": pod.namespace},
               "reason": "FailedScheduling", "type": "Warning", "message": err.to_string(),
               "source": {"component": crate::hami_emulator::SCHEDULER_NAME}}),
    );
}

pub fn rejections(err: &FilterError) -> Vec<Rejection> {
    match err {
        FilterError::NoFit { rejections, .. } => rejections
            .iter()
            .map(|r| Rejection {
                id: r.id.clone(),
                reason: r.reason.name().to_owned(),
                message: r.to_string(),
            })
            .collect(),
        _ => Vec::new(),
    }
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The register devices, for labels.
pub fn devices(register: Option<&Value>) -> Vec<NodeDevice> {
    register
        .and_then(|r| serde_json::from_value(r.clone()).ok())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qos_classes() {
        let pod = |res: Value| json!({"spec": {"containers": [{"name": "c", "resources": res}]}});
        assert_eq!(qos_class(&pod(json!({}))), QosClass::BestEffort);
        let limits = json!({"limits": {"cpu": "1", "memory": "1Gi"}});
        assert_eq!(qos_class(&pod(limits)), QosClass::Guaranteed);
        let some = json!({"requests": {"cpu": "1"}});
        assert_eq!(qos_class(&pod(some)), QosClass::Burstable);
    }

    #[test]
    fn preferred_ids_follow_grants() {
        let g = |id: &str| Grant {
            id: id.into(),
            device_type: "T".into(),
            mem_mib: 1,
            cus: 1,
        };
        let ids = vec!["A#3".to_owned(), "B#0".to_owned()];
        assert!(follows(&ids, &[g("A"), g("B")]));
        assert!(!follows(&ids, &[g("B"), g("A")]));
        let available: Vec<String> = ["A#0", "A#1", "B#0"].map(str::to_owned).into();
        assert_eq!(first_slots(&available, &[g("A"), g("A")]), ["A#0", "A#1"]);
    }

    #[test]
    fn init_devices_are_reused_until_an_app_or_sidecar_takes_them() {
        let ids = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let mut reusable = Vec::new();
        reuse(&mut reusable, &ids(&["A#0"]), true);
        reuse(&mut reusable, &ids(&["A#0", "B#0"]), true);
        assert_eq!(reusable, ids(&["A#0", "B#0"]), "init containers add theirs");
        reuse(&mut reusable, &ids(&["A#0"]), false);
        assert_eq!(reusable, ids(&["B#0"]), "an app container takes its own");
        let pod = json!({"spec": {"initContainers": [
            {"name": "side", "restartPolicy": "Always"}, {"name": "once"}]}});
        assert!(is_sidecar(&pod, "side") && !is_sidecar(&pod, "once"));
    }
}
