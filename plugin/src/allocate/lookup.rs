//! Reading a pod when the cached view does not have it: the lock owner for
//! Allocate, and any pod of this node for PreStartContainer. Both look where
//! Allocate looks (pods known ahead of the cache, the cache), then read the
//! API server once; a pod read joins the view like one of our writes.

use std::{future::Future, pin::Pin, sync::Arc};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, ResourceExt};
use tracing::info;

use super::{Allocator, pod};
use crate::{kube::CALL_TIMEOUT, vram::PodLookup};

impl Allocator {
    /// Off the happy path: the cached view did not name a fitting pod (the
    /// watch lags behind HAMi's lock or the pod); read the node and the lock
    /// owner once from the API server. A pod bound to another node is not
    /// this node's to allocate, whatever the lock says.
    pub(super) async fn lock_owner_from_api(&self, count: usize) -> Option<Arc<Pod>> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let node = tokio::time::timeout(CALL_TIMEOUT, nodes.get(&self.caches.node_name))
            .await
            .ok()?
            .ok()?;
        let (namespace, name) = pod::lock_owner(&node).ok().flatten()?;
        let pod = self.read_pod(&namespace, &name).await.ok()?;
        info!(pod = %format!("{namespace}/{name}"), "the cache lagged behind the lock; read it");
        let here = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        (here == Some(self.caches.node_name.as_str()) && pod::next_entry_len(&pod) == Some(count))
            .then_some(pod)
    }

    /// One GET of the pod from the API server.
    async fn read_pod(&self, namespace: &str, name: &str) -> Result<Arc<Pod>, String> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(CALL_TIMEOUT, api.get(name)).await {
            Ok(Ok(pod)) => Ok(Arc::new(pod)),
            Ok(Err(err)) => Err(format!("reading it from the API server: {err}")),
            Err(_) => Err(format!(
                "reading it from the API server timed out after {CALL_TIMEOUT:?}"
            )),
        }
    }

    /// The pod `namespace/name` (of `uid`, when given): known ahead of the
    /// cache, cached, or read once.
    async fn find_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<Arc<Pod>, String> {
        if let Some(pod) = self.ours.ahead_of_cache(namespace, name, uid) {
            return Ok(pod);
        }
        let matches = |p: &Pod| {
            p.namespace().as_deref() == Some(namespace)
                && p.name_any() == name
                && uid.is_none_or(|u| p.metadata.uid.as_deref() == Some(u))
        };
        if let Some(pod) = self.caches.pods.state().into_iter().find(|p| matches(p)) {
            return Ok(pod);
        }
        let pod = self.read_pod(namespace, name).await?;
        if !matches(&pod) {
            let found = pod.metadata.uid.as_deref().unwrap_or("none");
            return Err(format!(
                "the API server has another pod of that name (uid {found}, not {})",
                uid.unwrap_or_default()
            ));
        }
        info!(pod = %format!("{namespace}/{name}"), "not in the watch cache yet; read it");
        self.ours.learned(Arc::clone(&pod));
        Ok(pod)
    }
}

impl PodLookup for Allocator {
    fn find<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    ) -> Pin<Box<dyn Future<Output = Result<Arc<Pod>, String>> + Send + 'a>> {
        Box::pin(self.find_pod(namespace, name, uid))
    }
}
