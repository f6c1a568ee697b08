//! What the real-cluster tests and benches put in the cluster before the
//! plugin runs: a Node as kubelet registers it, pods as kube-scheduler binds
//! them, and the chart applied as Helm would.

use std::io;

use k8s_openapi::api::core::v1::Node;
use kube::{
    Api, Client,
    api::{Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

use super::{ADMIN_TOKEN, RealCluster, chart};

fn kube_error(what: &str, err: kube::Error) -> io::Error {
    io::Error::other(format!("{what}: {err}"))
}

/// A Node as kubelet would register it: capacity and a Ready condition,
/// without the not-ready taint.
///
/// # Errors
/// When the API server refuses a request (the message names which).
pub async fn add_node(client: &Client, name: &str) -> io::Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = json!({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}});
    let node: Node = serde_json::from_value(node).map_err(io::Error::other)?;
    let what = format!("creating node {name}");
    nodes
        .create(&PostParams::default(), &node)
        .await
        .map_err(|e| kube_error(&what, e))?;
    let status = json!({"status": {
        "capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "simulated", "lastHeartbeatTime": null}],
    }});
    let what = format!("the status of node {name}");
    nodes
        .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map_err(|e| kube_error(&what, e))?;
    // What the node lifecycle controller (kube-controller-manager, not run)
    // does once the node is Ready: lift the not-ready taint admission put on.
    let untainted = json!({"spec": {"taints": null}});
    let what = format!("the taints of node {name}");
    nodes
        .patch(name, &PatchParams::default(), &Patch::Merge(&untainted))
        .await
        .map_err(|e| kube_error(&what, e))?;
    Ok(())
}

/// A pod bound to `node` (as kube-scheduler would have bound it) that runs
/// as ServiceAccount `account`.
///
/// # Errors
/// When the API server does not create it.
pub fn add_pod(
    cluster: &RealCluster,
    namespace: &str,
    name: &str,
    node: &str,
    account: &str,
) -> io::Result<()> {
    let pod = json!({"apiVersion": "v1", "kind": "Pod",
                     "metadata": {"name": name, "namespace": namespace},
                     "spec": {"nodeName": node, "serviceAccountName": account,
                              "containers": [{"name": "c", "image": "busybox"}]}});
    let path = format!("/api/v1/namespaces/{namespace}/pods");
    let (code, answer) = cluster.request_as(ADMIN_TOKEN, "POST", &path, Some(&pod.to_string()))?;
    if code != 201 {
        return Err(io::Error::other(format!(
            "creating {namespace}/{name}: {code} {answer}"
        )));
    }
    Ok(())
}

/// The writers the chart lets write HAMi's pod annotations in these tests
/// (`validatingAdmissionPolicy.writers`): the administrator, who plays
/// HAMi's scheduler here.
pub const HAMI_WRITERS: &str = r#"{"serviceAccounts": [], "users": ["admin"]}"#;

/// Applies the chart (its policies on, the administrator as HAMi's
/// scheduler), all but the DaemonSet (no kubelet runs its pods here); the
/// rendered objects.
///
/// # Errors
/// When rendering fails or the API server refuses an object.
pub fn apply_chart(cluster: &RealCluster) -> io::Result<Vec<Value>> {
    let objects = chart::render(&[
        ("validatingAdmissionPolicy.enabled", "true"),
        ("validatingAdmissionPolicy.writers", HAMI_WRITERS),
    ])?;
    for object in objects.iter().filter(|o| o["kind"] != "DaemonSet") {
        let (code, answer) = cluster.apply(object)?;
        if code != 200 && code != 201 {
            return Err(io::Error::other(format!(
                "applying {}: {code} {answer}",
                object["kind"]
            )));
        }
    }
    Ok(objects)
}

/// `Some` once kubelet reports Node `name` Ready.
pub async fn node_ready(
    nodes: &kube::Api<k8s_openapi::api::core::v1::Node>,
    name: &str,
) -> Option<()> {
    let node = nodes.get(name).await.ok()?;
    let conditions = node.status?.conditions?;
    conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True")
        .then_some(())
}
