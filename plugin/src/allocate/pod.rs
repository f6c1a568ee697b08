//! Finding the pod HAMi is binding (docs/hami-protocol.md §3.4) in the
//! watch cache:
//! the owner of the node lock, else the one pod the fallback rule names
//! among those bound here whose spec asks for the devices (see [`find`]).

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;

use crate::{
    hami::{DevicesAnnotation, TO_ALLOCATE_KEY, parse_pod_devices},
    kube::container_asks,
};

/// The node lock shared by every HAMi vendor.
pub(crate) const LOCK_KEY: &str = "hami.io/mutex.lock";
pub(crate) const BIND_PHASE_KEY: &str = "hami.io/bind-phase";
pub(crate) const BIND_TIME_KEY: &str = "hami.io/bind-time";
pub(crate) const VGPU_NODE_KEY: &str = "hami.io/vgpu-node";

/// Who holds the node lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum LockOwner {
    /// `<time>,<namespace>,<name>`.
    Pod { namespace: String, name: String },
    /// A bare time: the legacy form, no owner.
    Legacy,
}

/// A `hami.io/mutex.lock` with commas that is not `<time>,<namespace>,<pod>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{LOCK_KEY} {value:?} is not <time>,<namespace>,<pod>")]
pub(crate) struct LockError {
    pub(crate) value: String,
}

/// Why no pod, or no single pod, is the one being bound.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FindError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(
        "the node lock names {pod}, which has no pending entry of {count} device(s) on node \
         {node}"
    )]
    LockOwnerNotPending {
        pod: String,
        count: usize,
        node: String,
    },
    #[error("no binding pod found on node {node} for {count} AMD device(s)")]
    NoPod { node: String, count: usize },
    #[error(
        "{} pods on node {node} claim to be bound for {count} AMD device(s) and no node lock \
         names one: {}; refusing to guess, since their bind-time is theirs to write \
         (--annotations-protected once admission protects HAMi's annotations)",
        pods.len(),
        pods.join(", ")
    )]
    Ambiguous {
        node: String,
        count: usize,
        pods: Vec<String>,
    },
}

/// Parses `hami.io/mutex.lock` (§3.7).
///
/// # Errors
/// A value with commas that is not exactly three parts.
pub(crate) fn parse_lock(value: &str) -> Result<LockOwner, LockError> {
    if !value.contains(',') {
        return Ok(LockOwner::Legacy);
    }
    match value.split(',').collect::<Vec<_>>().as_slice() {
        [_, ns, name] if !ns.is_empty() && !name.is_empty() => Ok(LockOwner::Pod {
            namespace: (*ns).to_owned(),
            name: (*name).to_owned(),
        }),
        _ => Err(LockError {
            value: value.to_owned(),
        }),
    }
}

/// The lock owner of `node`, if a lock with an owner is set.
///
/// # Errors
/// A malformed lock (which aborts Allocate, as in HAMi).
pub(crate) fn lock_owner(node: &Node) -> Result<Option<(String, String)>, LockError> {
    match node.annotations().get(LOCK_KEY).map(|v| parse_lock(v)) {
        Some(Ok(LockOwner::Pod { namespace, name })) => Ok(Some((namespace, name))),
        Some(Err(err)) => Err(err),
        _ => Ok(None),
    }
}

/// How many devices the pod's next to-allocate entry holds, if any.
pub(crate) fn next_entry_len(pod: &Pod) -> Option<usize> {
    let value = pod.annotations().get(TO_ALLOCATE_KEY)?;
    let containers = parse_pod_devices(DevicesAnnotation::ToAllocate, value).ok()?;
    containers
        .into_iter()
        .find(|c| !c.is_empty())
        .map(|c| c.len())
}

/// What kubelet is allocating: `count` devices of `resource` on node
/// `node_name`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wanted<'a> {
    pub(crate) node_name: &'a str,
    pub(crate) resource: &'a str,
    pub(crate) count: usize,
    /// Only HAMi and the plugin can write HAMi's pod annotations (admission).
    pub(crate) annotations_protected: bool,
}

/// The pod being bound for `wanted`: the lock owner when the node lock names
/// one (HAMi wrote it on the node, which pods' authors cannot write), else
/// the Pending pod bound to this node that HAMi is allocating for and whose
/// spec asks for `count` devices of `resource` in some container. The
/// annotations of that fallback rule (`bind-time`, `bind-phase`,
/// `vgpu-node`) are the pod author's to write unless admission protects
/// them: with `annotations_protected` several candidates are settled by the
/// oldest `bind-time` (HAMi's rule), without it they are refused.
///
/// # Errors
/// A message saying why no pod, or no single pod, fits.
pub(crate) fn find(
    node: Option<&Node>,
    pods: &[Arc<Pod>],
    wanted: Wanted<'_>,
) -> Result<Arc<Pod>, FindError> {
    let Wanted {
        node_name, count, ..
    } = wanted;
    if let Some((namespace, name)) = node.map(lock_owner).transpose()?.flatten() {
        // A lock owner without a matching entry is a stale view (the lock
        // moved on, or the pod's last write has not come back yet).
        return pods
            .iter()
            .find(|p| p.namespace().as_deref() == Some(namespace.as_str()) && p.name_any() == name)
            .filter(|p| next_entry_len(p) == Some(count))
            .cloned()
            .ok_or_else(|| FindError::LockOwnerNotPending {
                pod: format!("{namespace}/{name}"),
                count,
                node: node_name.to_owned(),
            });
    }
    let mut candidates: Vec<&Arc<Pod>> = pods
        .iter()
        .filter(|p| fallback_candidate(p, wanted))
        .collect();
    if wanted.annotations_protected {
        candidates.sort_by_key(|p| {
            p.annotations()
                .get(BIND_TIME_KEY)
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(u64::MAX)
        });
        candidates.truncate(1);
    }
    match candidates.as_slice() {
        [one] => Ok(Arc::clone(one)),
        [] => Err(FindError::NoPod {
            node: node_name.to_owned(),
            count,
        }),
        many => Err(FindError::Ambiguous {
            node: node_name.to_owned(),
            count,
            pods: many
                .iter()
                .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
                .collect(),
        }),
    }
}

/// The fallback rule (docs/hami-protocol.md §3.4), narrowed to what a pod's author
/// cannot forge: kubelet's binding of the pod to this node and a container
/// of its spec asking for `count` devices of `resource`.
fn fallback_candidate(pod: &Pod, wanted: Wanted<'_>) -> bool {
    let a = pod.annotations();
    let bound_here =
        pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(wanted.node_name);
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
        && bound_here
        && a.contains_key(BIND_TIME_KEY)
        && binding_phase(a.get(BIND_PHASE_KEY).map(String::as_str))
        && a.get(VGPU_NODE_KEY).map(String::as_str) == Some(wanted.node_name)
        && next_entry_len(pod) == Some(wanted.count)
        && asks_for(pod, wanted.resource, wanted.count)
}

/// Whether `bind-phase` lets the pod still be bound: HAMi's `allocating`,
/// or `success` written by another vendor's plugin that allocated its own
/// devices of the pod first and released the node lock (HAMi's Go plugins
/// mark success when their part is done); the pod's pending AMD entry,
/// checked beside this, says our part is not.
fn binding_phase(phase: Option<&str>) -> bool {
    matches!(phase, Some("allocating" | "success"))
}

/// Whether a container (init or app) of `pod` asks for exactly `count`
/// devices of `resource` (an extended resource: its limit, or its request
/// when only that is given).
fn asks_for(pod: &Pod, resource: &str, count: usize) -> bool {
    asked(pod, resource).any(|n| usize::try_from(n).ok() == Some(count))
}

/// Whether a container (init or app) of `pod` asks for devices of
/// `resource` at all.
pub(crate) fn asks_for_any(pod: &Pod, resource: &str) -> bool {
    asked(pod, resource).any(|n| n > 0)
}

/// How many devices of `resource` each container of `pod` asks for (its
/// limit, or its request when only that is given; unparsable: skipped).
fn asked<'a>(pod: &'a Pod, resource: &'a str) -> impl Iterator<Item = u64> + 'a {
    let spec = pod.spec.as_ref();
    let init = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten();
    let app = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    init.chain(app)
        .filter_map(move |c| container_asks(c, resource))
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
                .to_string()
                .contains("mutex.lock")
        );
        assert!(parse_lock("t,,x").is_err());
    }
}
