//! The real control plane (issue 17): etcd, kube-apiserver and
//! kube-scheduler from `k8s.io/kubernetes` v1.36.3, built by
//! `tests/cluster/build.sh` (cached outside the clone), and the plugin
//! talking to that API server instead of the fake one.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tests::{
    bus::{Policy, PrivateBus},
    cluster::{
        ADMIN_TOKEN, RealCluster,
        chart::{self, NAMESPACE},
    },
    kubelet::FakeKubelet,
    stack,
};

use common::cluster::{LIMIT, add_node, add_pod, admin, apply_chart, eventually, hami_binds};

#[test]
fn the_real_scheduler_binds_a_pod_to_a_registered_node() {
    common::run_async(LIMIT, async {
        let cluster = RealCluster::start().unwrap();
        let client = admin(&cluster).await;
        add_node(&client, "node-a").await;
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
                         "spec": {"containers": [{"name": "c", "image": "busybox"}]}});
        pods.create(
            &PostParams::default(),
            &serde_json::from_value(pod).unwrap(),
        )
        .await
        .unwrap();
        let bound = eventually(
            Duration::from_secs(120),
            "binding by kube-scheduler",
            || {
                let pods = pods.clone();
                async move { pods.get("plain").await.ok()?.spec?.node_name }
            },
        );
        let node = match tokio::time::timeout(Duration::from_secs(61), bound).await {
            Ok(node) => node,
            Err(_) => panic!("no binding; {}", cluster.log_tail("kube-scheduler")),
        };
        assert_eq!(node, "node-a");
        let (code, version) = cluster.get_as(ADMIN_TOKEN, "/version").unwrap();
        assert_eq!(code, 200);
        let version: Value = serde_json::from_str(&version).unwrap();
        assert_eq!(version["gitVersion"], "v1.36.3", "{version}");
        let (code, _) = cluster.get_as("not-a-token", "/api/v1/nodes").unwrap();
        assert_eq!(code, 401, "an unknown token is refused");
    });
}

/// amd-gpud and the plugin on a fake MI300X node, the plugin against the
/// real API server with the token of the chart's ServiceAccount its pod
/// would get (the chart applied, its policy on); dropped together.
struct PluginNode {
    kubelet: FakeKubelet,
    plugin: stack::Process,
    _gpud: stack::Process,
    _bus: PrivateBus,
    _root: tempfile::TempDir,
}

async fn plugin_node(cluster: &RealCluster, node: &str, extra: &[&str]) -> PluginNode {
    let root = common::build_fixture("mi300x-8-spx");
    let bus = PrivateBus::start(Policy::Shipped).unwrap();
    let gpud = stack::gpud(&common::fake_node_exe(), &bus, root.path(), 0).unwrap();
    let kubelet = FakeKubelet::start().await.unwrap();
    apply_chart(cluster);
    add_pod(cluster, NAMESPACE, "plugin", node, chart::RELEASE);
    let token = cluster
        .pod_token(NAMESPACE, chart::RELEASE, "plugin")
        .unwrap();
    let kubeconfig = cluster.kubeconfig("plugin", &token).unwrap();
    let hook = common::world::install_hook(root.path());
    let mut args = vec!["--kube", kubeconfig.to_str().unwrap(), "--node-name", node];
    args.extend(["--hook-path", hook.as_str(), "--sandbox", "best-effort"]);
    args.extend_from_slice(extra);
    let plugin = stack::plugin(&common::fake_node_exe(), &bus, kubelet.dir(), args).unwrap();
    PluginNode {
        kubelet,
        plugin,
        _gpud: gpud,
        _bus: bus,
        _root: root,
    }
}

/// The register annotation's 8 devices, once the plugin has published them.
async fn registered(nodes: &Api<Node>, node: &str) -> Option<Vec<Value>> {
    let node = nodes.get(node).await.ok()?;
    let value = node
        .metadata
        .annotations?
        .get("hami.io/node-amd-register")?
        .clone();
    let devices: Vec<Value> = serde_json::from_str(&value).ok()?;
    (devices.len() == 8).then_some(devices)
}

/// The user name of the chart's ServiceAccount.
fn plugin_user() -> String {
    format!("system:serviceaccount:{NAMESPACE}:{}", chart::RELEASE)
}

/// The plugin publishes HAMi's register annotation on its Node (the chart's
/// RBAC and policy let it), its requests are in the audit log under the
/// chart's account, and it lives through a 60 s outage of the API server
/// and converges after it.
#[test]
fn the_plugin_registers_its_node_through_the_real_api_server() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, async {
        let mut cluster = RealCluster::start().unwrap();
        let client = admin(&cluster).await;
        add_node(&client, "gpu-node").await;
        let mut node = plugin_node(&cluster, "gpu-node", &["--register-interval", "2"]).await;
        let nodes: Api<Node> = Api::all(client.clone());
        let wait = || registered(&nodes, "gpu-node");
        let devices = eventually(Duration::from_secs(60), "the register annotation", wait).await;
        assert!(devices.iter().all(|d| d["health"] == true), "{devices:?}");
        let user = plugin_user();
        let patches = cluster
            .audit_events()
            .into_iter()
            .filter(|e| e["user"]["username"] == user.as_str() && e["verb"] == "patch")
            .filter(|e| e["objectRef"]["resource"] == "nodes")
            .count();
        assert!(
            patches >= 1,
            "the audit log names the plugin's patch of its node"
        );

        // A 60 s outage; the plugin lives through it, and the annotation,
        // taken away after it, comes back.
        cluster.stop_apiserver();
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert!(
            node.plugin.0.try_wait().unwrap().is_none(),
            "the plugin exited"
        );
        let back = Instant::now();
        cluster.start_apiserver_again().unwrap();
        eprintln!("the API server was ready again after {:?}", back.elapsed());
        let clear = json!({"metadata": {"annotations": {"hami.io/node-amd-register": null}}});
        nodes
            .patch("gpu-node", &PatchParams::default(), &Patch::Merge(&clear))
            .await
            .unwrap();
        let wait = || registered(&nodes, "gpu-node");
        eventually(
            Duration::from_secs(90),
            "the annotation after the outage",
            wait,
        )
        .await;
        eprintln!(
            "the annotation was back {:?} after the restart",
            back.elapsed()
        );
    });
}

/// One Allocate through the real API server, counted by its audit log: on
/// the happy path (the watches have delivered HAMi's writes) the plugin
/// reads nothing and writes twice (the pod, then the lock's release).
#[test]
fn an_allocate_reads_nothing_and_writes_twice_on_the_real_api_server() {
    if !common::can_run_bus_tests() {
        return;
    }
    common::run_async(LIMIT, async {
        let cluster = RealCluster::start().unwrap();
        let client = admin(&cluster).await;
        add_node(&client, "gpu-node").await;
        let node = plugin_node(&cluster, "gpu-node", &[]).await;
        let nodes: Api<Node> = Api::all(client.clone());
        let wait = || registered(&nodes, "gpu-node");
        let devices = eventually(Duration::from_secs(60), "the register annotation", wait).await;
        hami_binds(&cluster, "job", "gpu-node", &devices[0], (76, 4096));
        tokio::time::sleep(Duration::from_secs(1)).await; // the watches deliver
        let before = cluster.audit_events().len();
        let id = format!("{}#0", devices[0]["id"].as_str().unwrap());
        let answer = node.kubelet.allocate(vec![id]).await.unwrap();
        assert_eq!(answer.envs["HSA_CU_MASK"], "0:0-75");
        let unlocked = || {
            let nodes = nodes.clone();
            async move {
                let node = nodes.get("gpu-node").await.ok()?;
                let locked = node
                    .metadata
                    .annotations?
                    .contains_key("hami.io/mutex.lock");
                (!locked).then_some(())
            }
        };
        eventually(Duration::from_secs(10), "the lock's release", unlocked).await;
        let user = plugin_user();
        let calls: Vec<(String, String)> = cluster.audit_events()[before..]
            .iter()
            .filter(|e| e["user"]["username"] == user.as_str() && e["stage"] == "ResponseComplete")
            .filter(|e| e["verb"] != "watch")
            .map(|e| {
                let verb = e["verb"].as_str().unwrap_or_default().to_owned();
                (
                    verb,
                    e["objectRef"]["resource"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                )
            })
            .collect();
        let writes = [
            ("patch".to_owned(), "pods".to_owned()),
            ("patch".to_owned(), "nodes".to_owned()),
        ];
        assert_eq!(calls, writes, "the plugin's requests during the Allocate");
        let pod = cluster
            .get_as(ADMIN_TOKEN, "/api/v1/namespaces/default/pods/job")
            .unwrap()
            .1;
        let pod: Value = serde_json::from_str(&pod).unwrap();
        assert_eq!(
            pod["metadata"]["annotations"]["hami.io/bind-phase"],
            "success"
        );
    });
}
