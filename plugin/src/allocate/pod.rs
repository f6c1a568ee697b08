//! Finding the pod HAMi is binding (hami-protocol §3.4) in the watch cache:
//! the owner of the node lock, else the fallback rule, preferring the oldest
//! `bind-time`.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

use crate::hami::{DevicesAnnotation, TO_ALLOCATE_KEY, parse_pod_devices};

/// The node lock shared by every HAMi vendor.
pub const LOCK_KEY: &str = "hami.io/mutex.lock";
pub const BIND_PHASE_KEY: &str = "hami.io/bind-phase";
pub const BIND_TIME_KEY: &str = "hami.io/bind-time";
pub const VGPU_NODE_KEY: &str = "hami.io/vgpu-node";

/// Who holds the node lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockOwner {
    /// `<time>,<namespace>,<name>`.
    Pod { namespace: String, name: String },
    /// A bare time: the legacy form, no owner.
    Legacy,
}

/// Parses `hami.io/mutex.lock` (§3.7).
///
/// # Errors
/// A value with commas that is not exactly three parts.
pub fn parse_lock(value: &str) -> Result<LockOwner, String> {
    if !value.contains(',') {
        return Ok(LockOwner::Legacy);
    }
    match value.split(',').collect::<Vec<_>>().as_slice() {
        [_, ns, name] if !ns.is_empty() && !name.is_empty() => Ok(LockOwner::Pod {
            namespace: (*ns).to_owned(),
            name: (*name).to_owned(),
        }),
        _ => Err(format!(
            "{LOCK_KEY} {value:?} is not <time>,<namespace>,<pod>"
        )),
    }
}

/// The lock owner of `node`, if a lock with an owner is set.
///
/// # Errors
/// A malformed lock (which aborts Allocate, as in HAMi).
pub fn lock_owner(node: &Node) -> Result<Option<(String, String)>, String> {
    match node.annotations().get(LOCK_KEY).map(|v| parse_lock(v)) {
        Some(Ok(LockOwner::Pod { namespace, name })) => Ok(Some((namespace, name))),
        Some(Err(err)) => Err(err),
        _ => Ok(None),
    }
}

/// How many devices the pod's next to-allocate entry holds, if any.
pub fn next_entry_len(pod: &Pod) -> Option<usize> {
    let value = pod.annotations().get(TO_ALLOCATE_KEY)?;
    let containers = parse_pod_devices(DevicesAnnotation::ToAllocate, value).ok()?;
    containers
        .into_iter()
        .find(|c| !c.is_empty())
        .map(|c| c.len())
}

/// The pod being bound on `node_name` for a request of `count` devices.
///
/// # Errors
/// A message saying why no pod fits.
pub fn find(
    node: Option<&Node>,
    pods: &[Arc<Pod>],
    node_name: &str,
    count: usize,
) -> Result<Arc<Pod>, String> {
    if let Some((namespace, name)) = node.map(lock_owner).transpose()?.flatten() {
        // A lock owner without a matching entry is a stale view (the lock
        // moved on, or the pod's last write has not come back yet).
        return pods
            .iter()
            .find(|p| p.namespace().as_deref() == Some(namespace.as_str()) && p.name_any() == name)
            .filter(|p| next_entry_len(p) == Some(count))
            .cloned()
            .ok_or_else(|| {
                format!(
                    "the node lock names {namespace}/{name}, which has no pending entry of {count} \
                     device(s) on node {node_name}"
                )
            });
    }
    let mut candidates: Vec<&Arc<Pod>> = pods
        .iter()
        .filter(|p| {
            let a = p.annotations();
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
                && a.contains_key(BIND_TIME_KEY)
                && a.get(BIND_PHASE_KEY).map(String::as_str) == Some("allocating")
                && a.get(VGPU_NODE_KEY).map(String::as_str) == Some(node_name)
                && next_entry_len(p) == Some(count)
        })
        .collect();
    candidates.sort_by_key(|p| {
        p.annotations()
            .get(BIND_TIME_KEY)
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(u64::MAX)
    });
    candidates.first().map(|p| Arc::clone(p)).ok_or_else(|| {
        format!("no binding pod found on node {node_name} for {count} AMD device(s)")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_values() {
        assert_eq!(parse_lock("2026-08-21T06:20:39Z"), Ok(LockOwner::Legacy));
        assert_eq!(
            parse_lock("2026-08-21T06:20:39Z,default,rocm-job-0"),
            Ok(LockOwner::Pod {
                namespace: "default".into(),
                name: "rocm-job-0".into()
            })
        );
        assert!(
            parse_lock("2026-08-21T06:20:39Z,default")
                .unwrap_err()
                .contains("mutex.lock")
        );
        assert!(parse_lock("t,,x").is_err());
    }
}
