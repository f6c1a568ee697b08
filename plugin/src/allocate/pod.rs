//! Finding the pod HAMi is binding (docs/hami-protocol.md §3.4) among this
//! node's pods: the owner of the node lock or a pod HAMi bound without it,
//! which kubelet is admitting (see [`find`]).

use std::{collections::HashSet, sync::Arc};

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
        "the node lock names {pod}, which is not bound to node {node} with a pending entry of \
         {count} device(s), and no pod bound without the lock fits"
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
    /// The pods kubelet has taken in (pod-resources), when known: the pod it
    /// is admitting is among them, a pod bound after it is not.
    pub(crate) kubelet_knows: Option<&'a HashSet<(String, String)>>,
}

/// Where the pods [`find`] looks at come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    /// The watch cache (with the pods known ahead of it): it may lag behind
    /// HAMi's binding of the lock owner, so a lock owner missing from it is
    /// no evidence that the owner is not being bound here.
    Cache,
    /// One LIST of this node's pods from the API server, read after kubelet
    /// called: the pod kubelet admits is bound, so it is in the list.
    Listed,
}

/// The pod being bound for `wanted` among `pods` (this node's).
///
/// HAMi's rule (§3.4) takes the lock owner with no further check, but HAMi
/// takes the lock only for pods with AMD requests in app containers: a pod
/// asking only in init containers is bound without it, also between another
/// pod's lock and that pod's binding, and a lock whose owner is gone stays
/// until it expires. So the candidates are the lock owner when it is bound
/// here with a pending entry of `count` devices (HAMi wrote the lock on the
/// node, which pods' authors cannot write) and the pods of the fallback rule
/// ([`fallback_candidate`]).
///
/// 1. One candidate: that pod (on the cache, beside a lock owner that is
///    not a candidate, only when kubelet is known to have taken it in).
/// 2. Several: those kubelet has taken in (it admits one pod at a time, and
///    the one it admits now is known to it; a pod bound later is not); if
///    that leaves one, that pod.
/// 3. Else the lock owner, when it is a candidate (HAMi's choice).
/// 4. On the cache, a lock owner that is not a candidate is a question for
///    the API server ([`FindError::LockOwnerNotPending`]; the caller lists
///    the node's pods and asks again with [`Source::Listed`]).
/// 5. Else the fallback rule alone. Its annotations (`bind-time`,
///    `bind-phase`, `vgpu-node`) are the pod author's to write unless
///    admission protects them: with `annotations_protected` several
///    candidates are settled by the oldest `bind-time` (HAMi's rule),
///    without it they are refused.
///
/// # Errors
/// Why no pod, or no single pod, fits.
pub(crate) fn find(
    node: Option<&Node>,
    pods: &[Arc<Pod>],
    wanted: Wanted<'_>,
    source: Source,
) -> Result<Arc<Pod>, FindError> {
    let owner = node.map(lock_owner).transpose()?.flatten();
    let is_owner = |p: &Pod| {
        owner.as_ref().is_some_and(|(namespace, name)| {
            p.namespace().as_deref() == Some(namespace.as_str()) && p.name_any() == *name
        })
    };
    let pending_owner = pods.iter().find(|p| {
        is_owner(p) && bound_here(p, wanted.node_name) && next_entry_len(p) == Some(wanted.count)
    });
    let others: Vec<&Arc<Pod>> = pods
        .iter()
        .filter(|p| !is_owner(p) && fallback_candidate(p, wanted))
        .collect();
    let candidates: Vec<&Arc<Pod>> = pending_owner
        .into_iter()
        .chain(others.iter().copied())
        .collect();
    // On the cache, a lone candidate beside a lock owner that is not one
    // may still be the wrong pod: the owner's Binding may not have reached
    // the cache yet, and kubelet may be admitting it.
    let lone_is_sure = owner.is_none() || pending_owner.is_some() || source == Source::Listed;
    if let [one] = candidates.as_slice()
        && (lone_is_sure || knows_of(wanted, one))
    {
        return Ok(Arc::clone(one));
    }
    if let Some(knows) = wanted.kubelet_knows {
        let mut known = candidates.iter().filter(|p| knows.contains(&key_of(p)));
        if let (Some(one), None) = (known.next(), known.next()) {
            return Ok(Arc::clone(one));
        }
    }
    if let Some(owner) = pending_owner {
        return Ok(Arc::clone(owner));
    }
    match owner {
        Some((namespace, name)) if source == Source::Cache || others.is_empty() => {
            Err(FindError::LockOwnerNotPending {
                pod: format!("{namespace}/{name}"),
                count: wanted.count,
                node: wanted.node_name.to_owned(),
            })
        }
        _ => fallback(others, wanted),
    }
}

/// The fallback rule over its `candidates` (§3.4, narrowed; see [`find`]).
fn fallback(mut candidates: Vec<&Arc<Pod>>, wanted: Wanted<'_>) -> Result<Arc<Pod>, FindError> {
    let Wanted {
        node_name, count, ..
    } = wanted;
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

/// Whether kubelet has taken `pod` in (false when that is not known).
fn knows_of(wanted: Wanted<'_>, pod: &Pod) -> bool {
    wanted
        .kubelet_knows
        .is_some_and(|k| k.contains(&key_of(pod)))
}

/// `pod` as pod-resources names it.
fn key_of(pod: &Pod) -> (String, String) {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}

/// Whether kubelet's binding put `pod` on `node_name`.
fn bound_here(pod: &Pod, node_name: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node_name)
}

/// The fallback rule (docs/hami-protocol.md §3.4), narrowed to what a pod's author
/// cannot forge: kubelet's binding of the pod to this node and a container
/// of its spec asking for `count` devices of `resource`.
fn fallback_candidate(pod: &Pod, wanted: Wanted<'_>) -> bool {
    let a = pod.annotations();
    pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Pending")
        && bound_here(pod, wanted.node_name)
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
mod tests;
