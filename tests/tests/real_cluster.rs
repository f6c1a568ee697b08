//! The real control plane (issue 17): etcd, kube-apiserver and
//! kube-scheduler from `k8s.io/kubernetes` v1.36.3, built by
//! `tests/cluster/build.sh` (cached outside the clone), and the plugin
//! talking to that API server instead of the fake one.

// An integration-test file is itself the test module, and a failed unwrap is a
// failed test here.
#![allow(clippy::tests_outside_test_module, clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tests::{
    bus::{Policy, PrivateBus},
    cluster::{
        ADMIN_TOKEN, RealCluster,
        chart::{self, NAMESPACE},
    },
    kubelet::FakeKubelet,
    stack,
};

/// The first test of a fresh machine builds the components (minutes).
const LIMIT: Duration = Duration::from_secs(1500);

async fn admin(cluster: &RealCluster) -> Client {
    let config = cluster.client_config("admin", ADMIN_TOKEN).await.unwrap();
    Client::try_from(config).unwrap()
}

/// A Node as kubelet would register it: capacity and a Ready condition,
/// without the not-ready taint.
async fn add_node(client: &Client, name: &str) {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = json!({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}});
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(node).unwrap(),
        )
        .await
        .unwrap();
    let status = json!({"status": {
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "simulated", "lastHeartbeatTime": null}],
    }});
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
    // What the node lifecycle controller (kube-controller-manager, not run)
    // does once the node is Ready: lift the not-ready taint admission put on.
    let untainted = json!({"spec": {"taints": null}});
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&untainted))
        .await
        .unwrap();
}

/// Polls `f` every 100 ms until it returns `Some`, for at most `limit`.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    limit: Duration,
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(value) = f().await {
            return value;
        }
        assert!(
            start.elapsed() < limit,
            "{what} did not happen within {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

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

/// HAMi's Filter and Bind for pod `default/<name>` granted `cus` CUs and
/// `mem` MiB of `gpu` (a register device), written as HAMi's scheduler
/// writes them: the pod with its annotations, the node lock, the binding.
fn hami_binds(cluster: &RealCluster, name: &str, node: &str, gpu: &Value, (cus, mem): (u32, u32)) {
    let grant = tests::hami_emulator::Grant {
        id: gpu["id"].as_str().unwrap().to_owned(),
        device_type: gpu["type"].as_str().unwrap().to_owned(),
        mem_mib: mem,
        cus,
    };
    let entry = tests::hami_emulator::encode(&[vec![grant]]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "annotations": {
            "hami.io/vgpu-node": node, "hami.io/vgpu-time": now.to_string(),
            "hami.io/amd-devices-to-allocate": entry, "hami.io/amd-devices-allocated": entry,
            "hami.io/bind-phase": "allocating", "hami.io/bind-time": now.to_string()}},
        "spec": {"containers": [{"name": "c", "image": "rocm",
                                 "resources": {"limits": {"amd.com/gpu": "1"}}}]}});
    let (code, answer) = cluster
        .request_as(
            ADMIN_TOKEN,
            "POST",
            "/api/v1/namespaces/default/pods",
            Some(&pod.to_string()),
        )
        .unwrap();
    assert_eq!(code, 201, "{answer}");
    let lock = format!("{},default,{name}", tests::apiserver::rfc3339(now));
    let patch = json!({"metadata": {"annotations": {"hami.io/mutex.lock": lock}}}).to_string();
    let (code, answer) = cluster
        .merge_patch_as(ADMIN_TOKEN, &format!("/api/v1/nodes/{node}"), &patch)
        .unwrap();
    assert_eq!(code, 200, "{answer}");
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
    let path = format!("/api/v1/namespaces/default/pods/{name}/binding");
    let (code, answer) = cluster
        .request_as(ADMIN_TOKEN, "POST", &path, Some(&binding.to_string()))
        .unwrap();
    assert_eq!(code, 201, "{answer}");
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

/// A pod bound to `node` (as kube-scheduler would have bound it).
fn add_pod(cluster: &RealCluster, namespace: &str, name: &str, node: &str, account: &str) {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": name, "namespace": namespace},
                     "spec": {"nodeName": node, "serviceAccountName": account,
                              "containers": [{"name": "c", "image": "busybox"}]}});
    let path = format!("/api/v1/namespaces/{namespace}/pods");
    let (code, answer) = cluster
        .request_as(ADMIN_TOKEN, "POST", &path, Some(&pod.to_string()))
        .unwrap();
    assert_eq!(code, 201, "creating {namespace}/{name}: {answer}");
}

/// Applies the chart (its policy on), all but the DaemonSet (no kubelet
/// runs its pods here).
fn apply_chart(cluster: &RealCluster) -> Vec<Value> {
    let objects = chart::render(&[("validatingAdmissionPolicy.enabled", "true")]).unwrap();
    for object in objects.iter().filter(|o| o["kind"] != "DaemonSet") {
        let (code, answer) = cluster.apply(object).unwrap();
        assert!(
            code == 200 || code == 201,
            "applying {}: {code} {answer}",
            object["kind"]
        );
    }
    objects
}

/// The chart's RBAC and ValidatingAdmissionPolicy, applied from
/// `helm/amd-gpu` as Helm renders it: the plugin's ServiceAccount, with the
/// token its pod on node-a gets, may change HAMi's annotations of node-a
/// and of pods on node-a, and nothing else.
#[test]
fn the_charts_account_changes_only_hami_annotations_of_its_node_and_its_pods() {
    common::run_async(LIMIT, async {
        let cluster = RealCluster::start().unwrap();
        let client = admin(&cluster).await;
        add_node(&client, "node-a").await;
        add_node(&client, "node-b").await;
        let objects = apply_chart(&cluster);
        let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
        for kind in ["ServiceAccount", "ClusterRole", "ValidatingAdmissionPolicy"] {
            assert!(
                kinds.contains(&kind),
                "the chart renders a {kind}: {kinds:?}"
            );
        }
        add_pod(&cluster, NAMESPACE, "plugin-on-a", "node-a", chart::RELEASE);
        add_pod(&cluster, "default", "job-on-a", "node-a", "default");
        add_pod(&cluster, "default", "job-on-b", "node-b", "default");
        let token = cluster
            .pod_token(NAMESPACE, chart::RELEASE, "plugin-on-a")
            .unwrap();
        let hami = r#"{"metadata":{"annotations":{"hami.io/node-amd-register":"[]"}}}"#;
        let patch = |path: &str, body: &str| cluster.merge_patch_as(&token, path, body).unwrap();

        let (code, answer) = patch("/api/v1/nodes/node-a", hami);
        assert_eq!(code, 200, "its own node: {answer}");
        let job = r#"{"metadata":{"annotations":{"hami.io/bind-phase":"success"}}}"#;
        let (code, answer) = patch("/api/v1/namespaces/default/pods/job-on-a", job);
        assert_eq!(code, 200, "a pod on its node: {answer}");
        // The policy takes effect once the API server has loaded it.
        let refused = || {
            let (code, answer) = patch("/api/v1/nodes/node-b", hami);
            (code == 403).then_some(answer)
        };
        let answer = eventually(
            Duration::from_secs(30),
            "the policy refusing node-b",
            || {
                let answer = refused();
                async move { answer }
            },
        )
        .await;
        assert!(answer.contains("may not change node node-b"), "{answer}");
        let (code, answer) = patch("/api/v1/namespaces/default/pods/job-on-b", job);
        assert_eq!(code, 403, "a pod on another node: {answer}");
        let label = r#"{"metadata":{"labels":{"evil":"yes"}}}"#;
        let (code, answer) = patch("/api/v1/nodes/node-a", label);
        assert_eq!(code, 403, "a label of its own node: {answer}");
        assert!(answer.contains("only hami.io/ annotations"), "{answer}");
        let (code, _) = cluster
            .get_as(&token, "/api/v1/namespaces/kube-system/secrets")
            .unwrap();
        assert_eq!(code, 403, "RBAC: no secrets");
        let (code, _) = cluster
            .request_as(&token, "DELETE", "/api/v1/nodes/node-a", None)
            .unwrap();
        assert_eq!(code, 403, "RBAC: no deletes");
        let user = format!("system:serviceaccount:{NAMESPACE}:{}", chart::RELEASE);
        let audited = cluster
            .audit_events()
            .iter()
            .any(|e| e["user"]["username"] == user.as_str());
        assert!(audited, "the audit log names {user}");
    });
}
