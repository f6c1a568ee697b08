//! GetPreferredAllocation that follows HAMi (hami-protocol §4.4): slots of
//! the GPUs annotated for the container being admitted, so kubelet's records
//! name the GPUs HAMi chose. Without such an annotation the topology policy
//! answers instead.

use std::collections::HashSet;

use kube::ResourceExt;

use super::pod;
use crate::{
    allocator::parse_slot,
    hami::{DevicesAnnotation, TO_ALLOCATE_KEY, parse_pod_devices},
    kube::Caches,
    kubelet::AllocationHint,
};

/// HAMi's choice, read from the watch caches.
#[derive(Clone)]
pub struct HamiHint {
    pub caches: Caches,
}

impl std::fmt::Debug for HamiHint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HamiHint")
            .field("node", &self.caches.node_name)
            .finish()
    }
}

impl AllocationHint for HamiHint {
    fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: usize,
    ) -> Option<Vec<String>> {
        if !must_include.is_empty() {
            return None;
        }
        let node = self.caches.node();
        let pods = self.caches.pods.state();
        let pod = pod::find(node.as_deref(), &pods, &self.caches.node_name, size).ok()?;
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
}
