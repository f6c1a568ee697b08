//! Helpers of the real-cluster tests: the administrator's client, Nodes and
//! pods as kubelet and the scheduler would leave them, the chart applied.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};
use tests::cluster::{ADMIN_TOKEN, RealCluster, chart};

/// The first test of a fresh machine builds the components (minutes).
pub const LIMIT: Duration = Duration::from_secs(1500);

pub async fn admin(cluster: &RealCluster) -> Client {
    let config = cluster.client_config("admin", ADMIN_TOKEN).await.unwrap();
    Client::try_from(config).unwrap()
}

/// A Node as kubelet would register it: capacity and a Ready condition,
/// without the not-ready taint.
pub async fn add_node(client: &Client, name: &str) {
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
pub fn apply_chart(cluster: &RealCluster) -> Vec<Value> {
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
