//! `helm upgrade --install --wait` of the chart on a cluster whose node has
//! no GPU and no amd-gpud (issue 37, point 4), on the real control plane
//! (kube-apiserver, kube-scheduler, kube-controller-manager's DaemonSet and
//! node lifecycle controllers) and the real kubelet, through Helm's own
//! library, with the chart's default values but for the host paths, which
//! are moved into the test's scratch directories.
//!
//! The node's runtime (recording-cri) runs no container: the chart's hook
//! installer "exits" at its start, and every pod of the node reports a
//! loopback address of its own, where the test runs a real plugin with no
//! amd-gpud on its bus and its probe listener on the chart's probe port. So
//! kubelet's readiness probe of the DaemonSet's pod is answered by the
//! plugin's own `/readyz`: the rollout finishes only because a plugin on a
//! CPU node is ready with no device, and the test shows the converse too
//! (the plugin gone, the pod goes unready).
//!
//! Helm 3's wait counts a DaemonSet ready with up to `maxUnavailable` of its
//! pods unready (helm/helm `pkg/kube/ready.go`, `daemonSetReady`: with the
//! chart's `maxUnavailable: 1` and one node, none need be), so Helm's answer
//! alone proves little here; each rollout is also held to what `kubectl
//! rollout status` waits for: every node's pod of the current template
//! available.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::{net::SocketAddr, path::Path, time::Duration};

use common::cluster::{LIMIT, eventually};
use serde_json::Value;
use tests::{
    bus::{Policy, PrivateBus},
    cluster::{
        ADMIN_TOKEN, RealCluster,
        chart::{self, NAMESPACE},
        kubelet::{KubeletVersion, RealKubelet},
    },
    node_sim::monitor::Monitor,
    stack::{self, Process},
};

const NODE: &str = "cpu-node";
/// How long Helm may wait, and the test for a rollout.
const ROLLOUT: Duration = Duration::from_secs(180);

/// The chart's default values, but for the host paths: the kubelet's root,
/// the hook's directory and the bus's directory, all in the test's scratch
/// directories. `extra` is added.
fn values(kubelet: &RealKubelet, bus: &PrivateBus, hook: &Path) -> Vec<(String, String)> {
    let quoted = |p: &Path| serde_json::to_string(&p.display().to_string()).unwrap();
    let bus_dir = bus.socket.parent().unwrap();
    vec![
        ("kubeletRootDir".into(), quoted(&kubelet.root_dir())),
        ("dp.hostHookPath".into(), quoted(hook)),
        ("dbusSocketDir".into(), quoted(bus_dir)),
    ]
}

fn as_pairs(values: &[(String, String)]) -> Vec<(&str, &str)> {
    values
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// The chart's DaemonSet as rendered for `values`: its name and the port
/// its readiness probe asks.
fn rendered_daemonset(values: &[(&str, &str)]) -> (String, u16) {
    let objects = chart::render(values).unwrap();
    let ds = objects.iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    let port = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == container["readinessProbe"]["httpGet"]["port"])
        .unwrap()["containerPort"]
        .as_u64()
        .unwrap();
    let name = ds["metadata"]["name"].as_str().unwrap().to_owned();
    (name, u16::try_from(port).unwrap())
}

fn get(cluster: &RealCluster, path: &str) -> Value {
    let (code, body) = cluster.get_as(ADMIN_TOKEN, path).unwrap();
    assert_eq!(code, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}

fn daemonset(cluster: &RealCluster, name: &str) -> Value {
    get(
        cluster,
        &format!("/apis/apps/v1/namespaces/{NAMESPACE}/daemonsets/{name}"),
    )
}

/// What `kubectl rollout status` waits for (kubectl's DaemonSet status
/// viewer): the controller has seen the spec, and every node's pod is of
/// the current template and available; here, on the one node.
fn rolled_out(ds: &Value) -> bool {
    let status = &ds["status"];
    let number = |key: &str| status[key].as_i64().unwrap_or(0);
    let observed = ds["metadata"]["generation"].as_i64() <= status["observedGeneration"].as_i64();
    observed
        && number("desiredNumberScheduled") == 1
        && number("updatedNumberScheduled") >= 1
        && number("numberAvailable") >= 1
}

/// The DaemonSet's pods: name, `pod-template-generation`, Ready.
fn pods(cluster: &RealCluster, name: &str) -> Vec<(String, String, bool)> {
    let list = get(cluster, &format!("/api/v1/namespaces/{NAMESPACE}/pods"));
    let owned = |p: &&Value| {
        p["metadata"]["ownerReferences"]
            .as_array()
            .is_some_and(|o| o.iter().any(|r| r["name"] == name))
    };
    let items = list["items"].as_array().cloned().unwrap_or_default();
    items
        .iter()
        .filter(owned)
        .map(|p| {
            let ready = p["status"]["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
            });
            let generation = p["metadata"]["labels"]["pod-template-generation"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let name = p["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (name, generation, ready)
        })
        .collect()
}

/// Polls until the DaemonSet has rolled out to one ready pod of template
/// generation `generation`, and no other pod is left; returns that pod's
/// name.
async fn wait_rolled_out(cluster: &RealCluster, name: &str, generation: &str) -> String {
    let what = format!("the rollout of generation {generation}");
    eventually(ROLLOUT, &what, || {
        let ds = daemonset(cluster, name);
        let pods = pods(cluster, name);
        let done = match pods.as_slice() {
            [(pod, g, true)] if g == generation && rolled_out(&ds) => Some(pod.clone()),
            _ => None,
        };
        async move { done }
    })
    .await
}

/// The plugin of the CPU node: no Kubernetes API, no amd-gpud on `bus`, its
/// probes where kubelet asks the pod's.
fn cpu_node_plugin(bus: &PrivateBus, kubelet: &RealKubelet, probes: SocketAddr) -> Process {
    let metrics = SocketAddr::new(probes.ip(), stack::free_port().unwrap()).to_string();
    let extra = [
        "--node-name",
        NODE,
        "--sandbox",
        "off",
        "--metrics-address",
        &metrics,
        "--probe-address",
        &probes.to_string(),
    ];
    stack::plugin(
        &common::fake_node_exe(),
        bus,
        &kubelet.device_plugin_dir(),
        extra,
    )
    .unwrap()
}

#[test]
fn upgrade_install_waits_rolls_through_and_follows_the_plugins_readiness() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, async {
        let mut cluster = RealCluster::start_for_nodes(&[NODE]).unwrap();
        cluster.start_controllers().unwrap();
        let bus = PrivateBus::start(Policy::Shipped).unwrap();
        // A loopback address no other test or node-sim node holds meanwhile.
        let address = Monitor::claim().unwrap();
        let pod_ip = address.address.ip().to_string();
        let runtime = ["-pod-ip", &pod_ip, "-exit-at-start", "hook-installer"];
        let kubelet =
            RealKubelet::start_node_with_runtime(&cluster, KubeletVersion::Pinned, NODE, &runtime)
                .unwrap();
        let hook = tempfile::tempdir().unwrap();
        let mut set = values(&kubelet, &bus, hook.path());
        let (name, probe_port) = rendered_daemonset(&as_pairs(&set));
        let probes = SocketAddr::new(address.address.ip(), probe_port);

        let mut plugin = cpu_node_plugin(&bus, &kubelet, probes);
        let body = eventually(Duration::from_secs(30), "the plugin's /readyz", || {
            let answer = stack::http_get(probes, "/readyz").ok();
            async move { answer.filter(|(code, _)| *code == 200).map(|(_, b)| b) }
        })
        .await;
        assert!(body.contains("no device"), "a CPU node's plugin: {body}");

        let printed = chart::upgrade_install(&cluster, &as_pairs(&set), ROLLOUT).unwrap();
        assert_eq!(
            printed,
            format!("release {} revision 1 deployed", chart::RELEASE)
        );
        let first = wait_rolled_out(&cluster, &name, "1").await;

        // A changed value changes the pod template: the second upgrade
        // replaces the pod, as the chart's update strategy says.
        set.push(("dp.hipLogLevel".into(), "3".into()));
        let printed = chart::upgrade_install(&cluster, &as_pairs(&set), ROLLOUT).unwrap();
        assert_eq!(
            printed,
            format!("release {} revision 2 deployed", chart::RELEASE)
        );
        let second = wait_rolled_out(&cluster, &name, "2").await;
        assert_ne!(first, second, "the pod was replaced");

        // Readiness is the plugin's answer: without it the pod goes unready.
        plugin.kill();
        // The DaemonSet's count follows the pod's condition once its
        // controller has seen the change.
        eventually(ROLLOUT, "the pod unready once its plugin is gone", || {
            let unready = pods(&cluster, &name)
                .iter()
                .any(|(pod, _, ready)| *pod == second && !ready);
            let counted = daemonset(&cluster, &name)["status"]["numberReady"]
                .as_i64()
                .unwrap_or(0)
                == 0;
            async move { (unready && counted).then_some(()) }
        })
        .await;
    });
}
