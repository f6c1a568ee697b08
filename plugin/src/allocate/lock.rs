//! Releasing HAMi's node lock (docs/hami-protocol.md §3.7) after a pod's last
//! container is allocated (in the background: kubelet does not wait for it)
//! or when an Allocate failed.

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use serde_json::json;
use tracing::{info, warn};

use super::pod::{self, LOCK_KEY};
use crate::kube::{CALL_TIMEOUT, Caches};

/// Releases `hami.io/mutex.lock` if this pod holds it, guarded by the
/// node's resourceVersion (§3.7). A cached node that does not show this pod
/// holding the lock may lag behind HAMi's lock: the node is read once
/// before giving up. On a conflict the node is read again, ownership checked
/// again, and the release retried with back-off.
pub(crate) async fn release(client: &Client, caches: &Caches, pod: &Pod) {
    let owner = (pod.namespace().unwrap_or_default(), pod.name_any());
    let nodes: Api<Node> = Api::all(client.clone());
    let holds = |node: &Node| pod::lock_owner(node).ok().flatten() == Some(owner.clone());
    let mut node = match caches.node() {
        Some(cached) if holds(&cached) => Some((*cached).clone()),
        _ => read(&nodes, &caches.node_name).await,
    };
    let mut backoff = std::time::Duration::from_millis(100);
    for attempt in 1..=5 {
        let Some(current) = node.take() else { return };
        if !holds(&current) {
            return;
        }
        let body = json!({ "metadata": {
            "annotations": { LOCK_KEY: null },
            "resourceVersion": current.resource_version(),
        }});
        let (params, patch) = (PatchParams::default(), Patch::Merge(&body));
        match tokio::time::timeout(
            CALL_TIMEOUT,
            nodes.patch(&caches.node_name, &params, &patch),
        )
        .await
        {
            Ok(Ok(_)) => {
                info!("released the node lock");
                return;
            }
            Ok(Err(err)) => warn!(attempt, "releasing the node lock failed: {err}"),
            Err(_) => warn!(attempt, "releasing the node lock timed out"),
        }
        tokio::time::sleep(backoff).await;
        backoff *= 2;
        node = read(&nodes, &caches.node_name).await;
    }
    warn!("gave up releasing the node lock after 5 attempts; HAMi takes it back after its expiry");
}

/// The node as the API server has it now (`None` on an error or timeout).
async fn read(nodes: &Api<Node>, name: &str) -> Option<Node> {
    tokio::time::timeout(CALL_TIMEOUT, nodes.get(name))
        .await
        .ok()
        .and_then(Result::ok)
}
