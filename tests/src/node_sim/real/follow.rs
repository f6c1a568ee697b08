//! `--keep-running` on the real cluster: pods created after the report
//! (with `kubectl`, `schedulerName: hami-scheduler`) are placed by HAMi's
//! scheduler (the emulator as its extender, or a real HAMi scheduler) and
//! admitted by the real kubelet; node-sim reports each step of theirs on
//! stderr as it sees it.

use std::{collections::HashMap, time::Duration};

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, api::ListParams};

use super::RealSimulation;
use crate::{
    fixture::cgroup::{CgroupDriver, add_pod},
    node_sim::admit::qos_class,
};

/// What node-sim last said about a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    node: Option<String>,
    phase: String,
    bind_phase: String,
}

impl Seen {
    fn of(pod: &Pod) -> Self {
        let annotation = |k: &str| {
            pod.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(k))
                .cloned()
                .unwrap_or_default()
        };
        let status = pod.status.as_ref();
        Self {
            node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
            bind_phase: annotation("hami.io/bind-phase"),
        }
    }
}

/// One line about `pod` in state `seen`.
fn line(pod: &Pod, seen: &Seen) -> String {
    let name = format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or_default(),
        pod.metadata.name.as_deref().unwrap_or_default()
    );
    let devices = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("hami.io/amd-devices-allocated"))
        .map_or_else(|| "no AMD grant".to_owned(), |d| format!("granted {d}"));
    let message = pod
        .status
        .as_ref()
        .and_then(|s| s.message.clone().or_else(|| s.reason.clone()))
        .unwrap_or_default();
    match &seen.node {
        None => format!("pod {name}: not placed yet {message}"),
        Some(node) => format!(
            "pod {name} on {node}: {devices}; bind-phase {:?}; phase {} {message}",
            seen.bind_phase, seen.phase
        ),
    }
}

impl RealSimulation {
    /// The pod cgroup of a pod bound to one of the nodes, as kubelet makes
    /// it on a real node (kubelet runs here without per-pod cgroups; the
    /// VRAM cap at PreStartContainer is written there; kubelet retries a
    /// container start that came first).
    fn make_pod_cgroup(&self, pod: &Pod, seen: &Seen) {
        let (Some(node), Some(uid)) = (&seen.node, pod.metadata.uid.as_deref()) else {
            return;
        };
        let Some(node) = self.nodes.iter().find(|n| &n.name == node) else {
            return;
        };
        let manifest = serde_json::to_value(pod).unwrap_or_default();
        let qos = qos_class(&manifest);
        if let Err(err) = add_pod(&node.host.root, CgroupDriver::Systemd, qos, uid) {
            let what = format!("could not make the pod cgroup of {uid}: {err}");
            self.session.host.progress.step(&node.name, &what);
        }
    }

    /// Reports, until dropped, every change of a pod the run did not create.
    pub async fn follow_new_pods(&self) {
        let known: Vec<String> = self.report.pods.iter().map(|p| p.name.clone()).collect();
        let pods: Api<Pod> = Api::all(self.session.client.clone());
        let mut seen: HashMap<String, Seen> = HashMap::new();
        loop {
            if let Ok(listed) = pods.list(&ListParams::default()).await {
                for pod in &listed.items {
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let ours = pod.metadata.namespace.as_deref() != Some("kube-system");
                    if known.contains(&name) || !ours {
                        continue;
                    }
                    let now = Seen::of(pod);
                    if seen.get(&name).is_none_or(|s| s.node.is_none()) {
                        self.make_pod_cgroup(pod, &now);
                    }
                    if seen.get(&name) != Some(&now) {
                        self.session.host.progress.step("kubectl", &line(pod, &now));
                        seen.insert(name, now);
                    }
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
