//! Helpers of the real-cluster tests: the administrator's client, Nodes and
//! pods as kubelet and the scheduler would leave them, the chart applied.

use std::time::{Duration, Instant};

use kube::Client;
use serde_json::{Value, json};
use tests::cluster::{ADMIN_TOKEN, RealCluster, setup};

/// The first test of a fresh machine builds the components (minutes).
pub const LIMIT: Duration = Duration::from_secs(1500);

pub async fn admin(cluster: &RealCluster) -> Client {
    let config = cluster.client_config("admin", ADMIN_TOKEN).await.unwrap();
    Client::try_from(config).unwrap()
}

/// A Node as kubelet would register it (see [`setup::add_node`]).
pub async fn add_node(client: &Client, name: &str) {
    setup::add_node(client, name).await.unwrap();
}

/// Polls `f` every 100 ms until it returns `Some`, for at most `limit`.
pub async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
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

/// A pod bound to `node` (as kube-scheduler would have bound it).
pub fn add_pod(cluster: &RealCluster, namespace: &str, name: &str, node: &str, account: &str) {
    setup::add_pod(cluster, namespace, name, node, account).unwrap();
}

/// Applies the chart (its policy on), all but the DaemonSet.
pub fn apply_chart(cluster: &RealCluster) -> Vec<Value> {
    setup::apply_chart(cluster).unwrap()
}

/// HAMi's Filter and Bind for pod `default/<name>` granted `cus` CUs and
/// `mem` MiB of `gpu` (a register device), written as HAMi's scheduler
/// writes them: the pod with its annotations, the node lock, the binding.
pub fn hami_binds(cluster: &RealCluster, name: &str, node: &str, gpu: &Value, grant: (u32, u32)) {
    hami_places(cluster, name, node, gpu, grant);
    bind(cluster, name, node);
}

/// [`hami_binds`] up to the binding: the pod with HAMi's annotations and
/// the node lock; the pod's UID (for the pod cgroup kubelet would make).
pub fn hami_places(
    cluster: &RealCluster,
    name: &str,
    node: &str,
    gpu: &Value,
    grant: (u32, u32),
) -> String {
    let spec = json!({"containers": [{"name": "c", "image": "rocm",
                                      "resources": {"limits": {"amd.com/gpu": "1"}}}]});
    hami_places_spec(cluster, name, node, gpu, grant, &spec)
}

/// [`hami_places`] for a pod of `spec` whose one AMD container (the one
/// asking for `amd.com/gpu: 1`) is granted `cus` CUs and `mem` MiB of `gpu`.
/// A CPU-only init container adds no entry: HAMi's entries list only the
/// containers that ask for devices.
pub fn hami_places_spec(
    cluster: &RealCluster,
    name: &str,
    node: &str,
    gpu: &Value,
    (cus, mem): (u32, u32),
    spec: &Value,
) -> String {
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
        "spec": spec});
    let (code, answer) = cluster
        .request_as(
            ADMIN_TOKEN,
            "POST",
            "/api/v1/namespaces/default/pods",
            Some(&pod.to_string()),
        )
        .unwrap();
    assert_eq!(code, 201, "{answer}");
    let created: Value = serde_json::from_str(&answer).unwrap();
    let lock = format!("{},default,{name}", tests::apiserver::rfc3339(now));
    let patch = json!({"metadata": {"annotations": {"hami.io/mutex.lock": lock}}}).to_string();
    let (code, answer) = cluster
        .merge_patch_as(ADMIN_TOKEN, &format!("/api/v1/nodes/{node}"), &patch)
        .unwrap();
    assert_eq!(code, 200, "{answer}");
    created["metadata"]["uid"].as_str().unwrap().to_owned()
}

/// The binding of `default/<name>` to `node`, as kube-scheduler posts it
/// once HAMi's Bind agreed.
pub fn bind(cluster: &RealCluster, name: &str, node: &str) {
    let binding = json!({"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                         "target": {"apiVersion": "v1", "kind": "Node", "name": node}});
    let path = format!("/api/v1/namespaces/default/pods/{name}/binding");
    let (code, answer) = cluster
        .request_as(ADMIN_TOKEN, "POST", &path, Some(&binding.to_string()))
        .unwrap();
    assert_eq!(code, 201, "{answer}");
}
