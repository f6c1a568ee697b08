//! One node of the real cluster: the fake host root, bus and amd-gpud of
//! [`NodeHost`], the real kubelet (with `recording-cri`) registering the
//! Node, and the plugin registered with that kubelet, holding the token of
//! the chart's ServiceAccount bound to its own pod on the node.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use serde_json::{Value, json};

use super::RealSession;
use crate::{
    cluster::{
        chart::{self, NAMESPACE},
        kubelet::{KubeletVersion, RealKubelet},
        setup,
    },
    hami_emulator::{HamiEmulator, filter::REGISTER_KEY},
    node_sim::{
        error::SimError,
        node::{NodeHost, PluginPlaces, exited, start_plugin},
        options::Mode,
    },
    stack::Process,
};

/// How long kubelet and the plugin get for each start-up step (kubelet's
/// first status comes within its 10 s status period).
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(100);

/// A node of the real cluster. Fields drop in order: the plugin first,
/// then kubelet, amd-gpud and the bus.
pub struct RealNode {
    pub name: String,
    pub mode: Mode,
    pub hami: HamiEmulator,
    /// The Node's `amd.com/gpu` capacity once the plugin had registered.
    pub capacity: usize,
    /// Killed first when the node is dropped.
    _plugin: Process,
    pub kubelet: RealKubelet,
    pub host: NodeHost,
}

impl RealNode {
    /// Starts the node `--node` `node` in `mode`: its host, its kubelet
    /// (once the Node is Ready), then its plugin; returns once kubelet
    /// publishes the plugin's devices as the Node's `amd.com/gpu` capacity.
    ///
    /// # Errors
    /// As [`NodeHost::start`]; kubelet or the plugin not starting, exiting,
    /// or not getting there in time.
    pub async fn start(
        session: &RealSession,
        node: &str,
        mode: Mode,
        amdsmi: &str,
    ) -> Result<Self, SimError> {
        let host = NodeHost::start(&session.host, node, mode, amdsmi).await?;
        let name = host.name.clone();
        let say = |msg: &str| session.host.progress.step(&name, msg);
        let kubelet = RealKubelet::start_node(&session.cluster, KubeletVersion::Pinned, &name)
            .map_err(SimError::start(format!("kubelet of {name}")))?;
        say(&format!(
            "kubelet up (device manager at {})",
            kubelet.device_plugin_dir().display()
        ));
        let nodes: Api<Node> = Api::all(session.client.clone());
        let log = kubelet.log_path();
        wait(&log, "the Node Ready", || setup::node_ready(&nodes, &name)).await?;
        lift_not_ready(&nodes, &name).await?;
        say("Node Ready; its not-ready taint lifted, as the node lifecycle controller would");
        label(&nodes, &name, &host.fixture, mode).await?;
        let places = PluginPlaces {
            kubelet_dir: kubelet.device_plugin_dir(),
            kubeconfig: plugin_kubeconfig(session, &host.dir, &name)?,
            pod_resources: Some(kubelet.pod_resources_socket()),
            monitor: None,
        };
        let mut plugin = start_plugin(&session.host, &host, &places, mode)?;
        let plugin_log = host.dir.join("plugin.log");
        let capacity = {
            let start = Instant::now();
            loop {
                if let Some(count) = published(&nodes, &name).await {
                    break count;
                }
                exited("the plugin", &mut plugin, &plugin_log)?;
                if start.elapsed() > STEP_TIMEOUT {
                    return Err(timeout(
                        "amd.com/gpu capacity and the register annotation",
                        &log,
                    ));
                }
                tokio::time::sleep(POLL).await;
            }
        };
        say(&format!(
            "plugin registered with kubelet: capacity amd.com/gpu {capacity}, {REGISTER_KEY} published"
        ));
        Ok(Self {
            hami: HamiEmulator { node: name.clone() },
            name,
            mode,
            capacity: capacity.parse().unwrap_or_default(),
            _plugin: plugin,
            kubelet,
            host,
        })
    }

    /// The Node's register annotation, parsed.
    pub async fn register(&self, session: &RealSession) -> Option<Value> {
        let nodes: Api<Node> = Api::all(session.client.clone());
        let node = nodes.get(&self.name).await.ok()?;
        let text = node.metadata.annotations?.remove(REGISTER_KEY)?;
        serde_json::from_str(&text).ok()
    }

    /// The Node's taints as kubectl shows them (`key=value:Effect`).
    pub async fn taints(&self, session: &RealSession) -> Vec<String> {
        let nodes: Api<Node> = Api::all(session.client.clone());
        let node = nodes.get(&self.name).await.ok();
        let taints = node.and_then(|n| n.spec?.taints).unwrap_or_default();
        taints.iter().map(shown).collect()
    }

    /// The plugin's, amd-gpud's and kubelet's log files.
    pub fn logs(&self) -> [PathBuf; 3] {
        let [plugin, gpud] = self.host.logs();
        [plugin, gpud, self.kubelet.log_path()]
    }
}

/// Polls `check` until it answers, or times out naming `log`.
async fn wait<F, Fut>(log: &std::path::Path, what: &str, check: F) -> Result<(), SimError>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Option<()>>,
{
    let start = Instant::now();
    while check().await.is_none() {
        if start.elapsed() > STEP_TIMEOUT {
            return Err(timeout(what, log));
        }
        tokio::time::sleep(POLL).await;
    }
    Ok(())
}

fn timeout(what: &str, log: &std::path::Path) -> SimError {
    SimError::Timeout {
        what: what.to_owned(),
        secs: STEP_TIMEOUT.as_secs(),
        log: log.to_path_buf(),
    }
}

/// kubelet's `amd.com/gpu` capacity, once it is not 0 and the plugin's
/// register annotation is on the Node.
async fn published(nodes: &Api<Node>, name: &str) -> Option<String> {
    let node = nodes.get(name).await.ok()?;
    node.metadata.annotations.as_ref()?.get(REGISTER_KEY)?;
    let count = node.status?.capacity?.get("amd.com/gpu")?.0.clone();
    (count != "0").then_some(count)
}

/// The taints of the Ready condition, which the node lifecycle controller
/// lifts from a Ready node (kubernetes/kubernetes:
/// `pkg/controller/nodelifecycle`, its NoSchedule and NoExecute passes).
const CONDITION_TAINTS: [&str; 2] = [
    "node.kubernetes.io/not-ready",
    "node.kubernetes.io/unreachable",
];

/// What the node lifecycle controller (kube-controller-manager, which does
/// not run here) does once the Node is Ready: it lifts the
/// `node.kubernetes.io/not-ready:NoSchedule` taint the API server's
/// NodeTaint admission put on the Node when kubelet created it, without
/// which no real scheduler places a pod here. It stays lifted: kubelet
/// sets taints only when it creates the Node, and nothing else here adds
/// one. Guarded by the Node's resourceVersion, retried on a conflict.
async fn lift_not_ready(nodes: &Api<Node>, name: &str) -> Result<(), SimError> {
    let failed = |what: String| {
        SimError::start(format!("lifting the not-ready taint of Node {name}"))(
            std::io::Error::other(what),
        )
    };
    for _ in 0..10 {
        let node = nodes.get(name).await.map_err(|e| failed(e.to_string()))?;
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        let kept = lifted(&taints);
        if kept.len() == taints.len() {
            return Ok(());
        }
        let patch = json!({"metadata": {"resourceVersion": node.metadata.resource_version},
                           "spec": {"taints": kept}});
        match nodes
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(()),
            Err(kube::Error::Api(status)) if status.is_conflict() => {}
            Err(e) => return Err(failed(e.to_string())),
        }
    }
    Err(failed("10 conflicts in a row".to_owned()))
}

/// `taints` without those of the Ready condition.
fn lifted(taints: &[Taint]) -> Vec<Taint> {
    taints
        .iter()
        .filter(|t| !CONDITION_TAINTS.contains(&t.key.as_str()))
        .cloned()
        .collect()
}

/// A taint as kubectl shows it.
fn shown(taint: &Taint) -> String {
    match taint.value.as_deref() {
        Some(value) if !value.is_empty() => format!("{}={value}:{}", taint.key, taint.effect),
        _ => format!("{}:{}", taint.key, taint.effect),
    }
}

/// The labels the fake cluster's nodes carry (kubelet cannot be told them
/// here without restarting it).
async fn label(nodes: &Api<Node>, name: &str, fixture: &str, mode: Mode) -> Result<(), SimError> {
    let patch = json!({"metadata": {"labels": {"node-sim/fixture": fixture,
                                                "node-sim/mode": mode.as_str()}}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|e| SimError::start(format!("labelling Node {name}"))(std::io::Error::other(e)))
}

/// The chart's ServiceAccount token, bound to a pod of it on `node` (as
/// the DaemonSet's pod would hold it), in a kubeconfig under `dir`.
fn plugin_kubeconfig(
    session: &RealSession,
    dir: &std::path::Path,
    node: &str,
) -> Result<PathBuf, SimError> {
    let pod = format!("amd-device-plugin-{node}");
    let what = format!("the plugin's ServiceAccount token on {node}");
    setup::add_pod(&session.cluster, NAMESPACE, &pod, node, chart::RELEASE)
        .map_err(SimError::start(what.clone()))?;
    let token = session
        .cluster
        .pod_token(NAMESPACE, chart::RELEASE, &pod)
        .map_err(SimError::start(what.clone()))?;
    session
        .cluster
        .kubeconfig_in(dir, "plugin", &token)
        .map_err(SimError::start(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ready_node_loses_only_its_condition_taints() {
        let taint = |key: &str, effect: &str| Taint {
            key: key.into(),
            effect: effect.into(),
            ..Taint::default()
        };
        let taints = [
            taint("node.kubernetes.io/not-ready", "NoSchedule"),
            taint("node.kubernetes.io/not-ready", "NoExecute"),
            taint("gpu", "NoSchedule"),
        ];
        let kept: Vec<String> = lifted(&taints).iter().map(shown).collect();
        assert_eq!(kept, ["gpu:NoSchedule"]);
    }
}
