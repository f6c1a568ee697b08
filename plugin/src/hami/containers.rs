//! Which container of a pod each of HAMi's entries is for (docs/hami-protocol.md
//! §3.2): HAMi's AMD value lists only the containers that ask for AMD, init
//! containers first, in spec order, without placeholders. When the pod
//! spec's AMD containers do not number the value's non-empty entries, the
//! positions cannot be told and callers fall back to what is safe for them.

use k8s_openapi::api::core::v1::{Container, Pod};
use kube::ResourceExt;

use super::{DevicesAnnotation, parse_pod_devices};

/// How a container runs beside the pod's others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// A regular init container: runs alone, before the app containers.
    Init,
    /// An init container with `restartPolicy: Always`: starts in init
    /// order and keeps running beside every later container.
    Sidecar,
    /// An app container: runs beside the other app containers and sidecars.
    App,
}

/// One container that asks for the resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntryContainer<'a> {
    pub(crate) name: &'a str,
    pub(crate) stage: Stage,
}

fn requests(container: &Container, resource: &str) -> bool {
    container.resources.as_ref().is_some_and(|r| {
        [&r.limits, &r.requests]
            .into_iter()
            .flatten()
            .any(|m| m.contains_key(resource))
    })
}

/// Whether `container` is a sidecar (an init container that keeps running).
pub(crate) fn is_sidecar(container: &Container) -> bool {
    container.restart_policy.as_deref() == Some("Always")
}

/// The number of non-empty entries of `annotation` on `pod`, if it parses.
pub(crate) fn non_empty_entries(pod: &Pod, annotation: DevicesAnnotation) -> Option<usize> {
    let value = pod.annotations().get(annotation.key())?;
    let entries = parse_pod_devices(annotation, value).ok()?;
    Some(entries.iter().filter(|e| !e.is_empty()).count())
}

/// The containers of `pod` that ask for `resource`, in the order of HAMi's
/// entries, when they number `entries`; `None` otherwise.
pub(crate) fn entry_containers<'a>(
    pod: &'a Pod,
    resource: &str,
    entries: usize,
) -> Option<Vec<EntryContainer<'a>>> {
    let spec = pod.spec.as_ref()?;
    let init = spec.init_containers.iter().flatten().map(|c| {
        let stage = if is_sidecar(c) {
            Stage::Sidecar
        } else {
            Stage::Init
        };
        (c, stage)
    });
    let app = spec.containers.iter().map(|c| (c, Stage::App));
    let listed: Vec<EntryContainer<'a>> = init
        .chain(app)
        .filter(|(c, _)| requests(c, resource))
        .map(|(c, stage)| EntryContainer {
            name: c.name.as_str(),
            stage,
        })
        .collect();
    (listed.len() == entries).then_some(listed)
}

/// The container whose entry is next in the pod's to-allocate annotation
/// (kubelet admits init containers first, in spec order), when it can be
/// told.
pub(crate) fn next_container<'a>(pod: &'a Pod, resource: &str) -> Option<EntryContainer<'a>> {
    let granted = non_empty_entries(pod, DevicesAnnotation::Allocated)?;
    let left = non_empty_entries(pod, DevicesAnnotation::ToAllocate)?;
    let listed = entry_containers(pod, resource, granted)?;
    listed.get(granted.checked_sub(left)?).copied()
}
