//! Reading a pod when the cached view does not have it: the lock owner for
//! Allocate, and any pod of this node for PreStartContainer. Both look where
//! Allocate looks (pods known ahead of the cache, the cache), then read the
//! API server once; a pod read joins the view like one of our writes.

use std::{future::Future, pin::Pin, sync::Arc};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, ResourceExt, api::ListParams};
use tracing::{info, warn};

use super::{AllocateError, Allocator, pod};
use crate::{
    kube::CALL_TIMEOUT,
    vram::{PodLookup, PodLookupError, is_pod},
};

impl Allocator {
    /// Off the happy path: the cached view did not name a fitting pod (the
    /// watch lags behind HAMi's lock or binding, or the lock names a pod
    /// not being bound here: HAMi takes none for a pod whose AMD request is
    /// in init containers only, and a lock outlives a pod that is gone).
    /// Read the node and list its pods once from the API server and ask
    /// [`pod::find`] again on that list; a pod bound to another node is not
    /// in it, whatever the lock says. `cached` is the answer on the cache,
    /// returned when the API server cannot be read.
    pub(super) async fn pod_from_api(
        &self,
        wanted: pod::Wanted<'_>,
        cached: pod::FindError,
    ) -> Result<Arc<Pod>, pod::FindError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let read = tokio::time::timeout(CALL_TIMEOUT, nodes.get(&self.caches.node_name)).await;
        let Ok(Ok(node)) = read else {
            warn!("the node could not be read from the API server: {cached}");
            return Err(cached);
        };
        let Some(pods) = self.list_node_pods().await else {
            warn!("the node's pods could not be listed from the API server: {cached}");
            return Err(cached);
        };
        let found = pod::find(Some(&node), &pods, wanted, pod::Source::Listed)?;
        let who = format!(
            "{}/{}",
            found.namespace().unwrap_or_default(),
            found.name_any()
        );
        let lock = pod::lock_owner(&node).ok().flatten();
        match lock.filter(|(ns, name)| {
            found.namespace().as_ref() != Some(ns) || found.name_any() != *name
        }) {
            Some((ns, name)) => info!(
                pod = %who,
                lock = %format!("{ns}/{name}"),
                "the pod was bound without the node lock (its AMD request is in init containers \
                 only, or the lock is stale); listed the node's pods"
            ),
            None => {
                info!(pod = %who, "the cache lagged behind the pod being bound; listed the node's pods")
            }
        }
        Ok(found)
    }

    /// This node's pods as one LIST from the API server returns them now.
    async fn list_node_pods(&self) -> Option<Vec<Arc<Pod>>> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let fields = format!("spec.nodeName={}", self.caches.node_name);
        let params = ListParams::default().fields(&fields);
        let listed = tokio::time::timeout(CALL_TIMEOUT, api.list(&params))
            .await
            .ok()?
            .ok()?;
        Some(listed.items.into_iter().map(Arc::new).collect())
    }

    /// Lists the node's pods to forget those known ahead of the cache that
    /// are gone (the watch has not delivered anything for a long while).
    pub(super) async fn forget_gone_pods(&self) {
        let listed_after = std::time::Instant::now();
        if let Some(listed) = self.list_node_pods().await {
            self.ours.forget_gone(&listed, listed_after);
            let left = self.ours.ahead_len();
            warn!(
                left,
                "many pods known ahead of a watch that does not deliver; listed the node's pods"
            );
        }
    }

    /// The view Allocate plans on, from a fresh LIST instead of the cache,
    /// when the cached view may be behind HAMi: pods gone or done since
    /// still count there. Every write of ours came before the list (Allocates
    /// are serialised), so the list holds them; our CU records still undo
    /// users' edits.
    pub(super) async fn listed_view(&self, failed: &AllocateError) -> Option<Vec<Arc<Pod>>> {
        let listed = self.list_node_pods().await?;
        info!(
            pods = listed.len(),
            "no slice on the cached view ({failed}); planning once more on the node's pods as listed"
        );
        let (pods, edited) = self.ours.with_records(listed);
        self.report_distrust(edited, &pods);
        Some(pods)
    }

    /// One GET of the pod from the API server.
    async fn read_pod(&self, namespace: &str, name: &str) -> Result<Arc<Pod>, PodLookupError> {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        match tokio::time::timeout(CALL_TIMEOUT, api.get(name)).await {
            Ok(Ok(pod)) => Ok(Arc::new(pod)),
            Ok(Err(err)) => Err(PodLookupError::Read(err)),
            Err(_) => Err(PodLookupError::ReadTimeout(CALL_TIMEOUT)),
        }
    }

    /// The pod `namespace/name` (of `uid`, when given): known ahead of the
    /// cache, cached, or read once.
    async fn find_pod(
        &self,
        namespace: &str,
        name: &str,
        uid: Option<&str>,
    ) -> Result<Arc<Pod>, PodLookupError> {
        if let Some(pod) = self.ours.ahead_of_cache(namespace, name, uid) {
            return Ok(pod);
        }
        let matches = |p: &Pod| is_pod(p, namespace, name, uid);
        if let Some(pod) = self.caches.pods.state().into_iter().find(|p| matches(p)) {
            return Ok(pod);
        }
        let pod = self.read_pod(namespace, name).await?;
        if !matches(&pod) {
            return Err(PodLookupError::OtherUid {
                found: pod
                    .metadata
                    .uid
                    .clone()
                    .unwrap_or_else(|| "none".to_owned()),
                wanted: uid.unwrap_or_default().to_owned(),
            });
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
    ) -> Pin<Box<dyn Future<Output = Result<Arc<Pod>, PodLookupError>> + Send + 'a>> {
        Box::pin(self.find_pod(namespace, name, uid))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Node;
    use kube::runtime::{reflector, watcher};
    use serde_json::json;
    use tokio::sync::watch;

    use super::*;
    use crate::{allocate::AllocateConfig, inventory::Snapshot, kube::Caches, vram::Owners};

    fn pod(name: &str, uid: &str, rv: &str) -> Pod {
        serde_json::from_value(json!({"metadata": {
            "name": name, "namespace": "ns", "uid": uid, "resourceVersion": rv}}))
        .unwrap()
    }

    /// An Allocator whose cache holds `cached` and whose API server does
    /// not answer (nothing listens on the port).
    fn allocator(cached: Vec<Pod>) -> Allocator {
        let (pods, mut writer) = reflector::store::<Pod>();
        writer.apply_watcher_event(&watcher::Event::Init);
        for p in cached {
            writer.apply_watcher_event(&watcher::Event::InitApply(p));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let (nodes, _) = reflector::store::<Node>();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let uri = format!("http://127.0.0.1:{port}").parse().unwrap();
        let client = kube::Client::try_from(kube::Config::new(uri)).unwrap();
        let config = AllocateConfig {
            dev_dir: "/dev".into(),
            hook_dir: "/nonexistent".into(),
            resource_name: "amd.com/gpu".into(),
            cdi: false,
            pod_resources: None,
            annotations_protected: false,
            staged_hooks: None,
            hip_log_level: 0,
            split_count: 0,
        };
        let (_, snapshots) = watch::channel(Snapshot::default());
        let caches = Caches::from_stores("n", nodes, pods);
        let owners = Arc::new(Owners::new(None, "amd.com/gpu"));
        Allocator::new(client, caches, snapshots, config, owners)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn prestart_finds_a_pod_ahead_of_the_cache_then_in_it_then_asks_the_api() {
        let a = allocator(vec![pod("cached", "u-c", "3")]);
        a.ours.learned(Arc::new(pod("written", "u-w", "9")));
        let within = |f| tokio::time::timeout(Duration::from_secs(20), f);
        let found = within(a.find("ns", "written", Some("u-w"))).await.unwrap();
        assert_eq!(found.unwrap().resource_version().as_deref(), Some("9"));
        let found = within(a.find("ns", "cached", None)).await.unwrap();
        assert_eq!(found.unwrap().uid().as_deref(), Some("u-c"));
        // Another uid under a cached name: only the API server could tell.
        let err = within(a.find("ns", "cached", Some("u-other")))
            .await
            .unwrap();
        assert!(err.unwrap_err().to_string().contains("API server"));
    }
}
