//! GetPreferredAllocation that follows HAMi (docs/hami-protocol.md §4.4): slots of
//! the GPUs annotated for the container being admitted, so kubelet's records
//! name the GPUs HAMi chose. Without such an annotation the topology policy
//! answers instead.
//!
//! The real kubelet asks as soon as it sees the pod bound, which is when
//! our watch sees it too: the cached view often does not name the pod yet
//! (measured with kubelet 1.36: three of six example pods got slots of
//! other GPUs). The pod is therefore looked up the way Allocate looks it
//! up (pods known ahead of the cache, the cache, then the API server once),
//! and a pod read from the API server joins the view for Allocate.

use std::{collections::HashSet, future::Future, pin::Pin, sync::Arc};

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{Allocator, admitted::Admitted, pod};
use crate::{
    hami::{DevicesAnnotation, TO_ALLOCATE_KEY, parse_pod_devices},
    preferred::{AllocationHint, parse_slot},
};

/// HAMi's choice, read from Allocate's view of the pods.
#[derive(Clone)]
pub(crate) struct HamiHint {
    pub(crate) allocator: Arc<Allocator>,
}

impl std::fmt::Debug for HamiHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HamiHint")
            .field("node", &self.allocator.caches.node_name)
            .finish()
    }
}

impl AllocationHint for HamiHint {
    fn preferred<'a>(
        &'a self,
        available: &'a [String],
        must_include: &'a [String],
        size: usize,
    ) -> Pin<Box<dyn Future<Output = Option<Vec<String>>> + Send + 'a>> {
        Box::pin(async move {
            if !must_include.is_empty() {
                return None;
            }
            let pod = self.allocator.pod_being_bound(size).await?;
            slots_for(&pod, available)
        })
    }
}

impl Allocator {
    /// The pod HAMi is binding for a request of `size` devices: from the
    /// view Allocate plans on, else read once from the API server (and
    /// then known ahead of the cache).
    async fn pod_being_bound(&self, size: usize) -> Option<Arc<Pod>> {
        let node = self.caches.node();
        let (mark, cached) = self.caches.pods_with_mark();
        let (pods, _) = self.ours.view(mark, cached);
        let resource = &self.config.resource_name;
        let admitted = Admitted::read(self.config.pod_resources.as_deref(), resource).await;
        let wanted = self.wanted(size, &admitted);
        let err = match pod::find(node.as_deref(), &pods, wanted, pod::Source::Cache) {
            Ok(pod) => return Some(pod),
            Err(err) => err,
        };
        let pod = self.pod_from_api(wanted, err).await.ok()?;
        self.ours.learned(Arc::clone(&pod));
        Some(pod)
    }
}

/// One free slot of each GPU of the pod's next `to-allocate` entry, in
/// its order; `None` when a GPU has no free slot among `available`.
fn slots_for(pod: &Pod, available: &[String]) -> Option<Vec<String>> {
    let value = pod.annotations().get(TO_ALLOCATE_KEY)?;
    let entry = parse_pod_devices(DevicesAnnotation::ToAllocate, value)
        .ok()?
        .into_iter()
        .find(|c| !c.is_empty())?;
    let mut taken = HashSet::new();
    let mut ids = Vec::with_capacity(entry.len());
    for device in &entry {
        let id = available.iter().find(|id| {
            !taken.contains(id.as_str())
                && parse_slot(id).is_some_and(|(gpu, _)| gpu == device.uuid)
        })?;
        taken.insert(id.as_str());
        ids.push(id.clone());
    }
    Some(ids)
}
