//! Hard VRAM caps at PreStartContainer (docs/dmem.md §3.5): the pod cgroup
//! exists then (it does not at Allocate), so this is where the plugin asks
//! amd-gpud to write the pod's `dmem.max`, one region per GPU, holding the
//! VRAM its containers that run at once from then on were granted
//! (`hami.io/amd-devices-allocated`), never more than HAMi counts for the
//! pod ([`phase`]).
//!
//! PreStartContainer carries only device ids; the pod is the one Allocate
//! gave them to (kept in [`owners::Owners`]), or after a restart the one
//! kubelet's pod-resources API names for them. The pod itself is found the
//! way Allocate finds it ([`PodLookup`]), so a watch that lags behind
//! Allocate's write does not fail the container start. With `--dmem-backend on` a
//! cap that cannot be applied fails the container start; with `auto` it is
//! logged and reported as a Warning Event on the pod, and the container starts
//! with the cooperative limit only.
//!
//! [`owners`] records and recovers the pod of each device id; [`gpud`] is
//! the [`CapSink`] that asks amd-gpud.

pub(crate) mod error;
pub(crate) mod gpud;
pub(crate) mod owners;
pub(crate) mod phase;

use std::{collections::BTreeMap, fmt, future::Future, pin::Pin, sync::Arc};

pub(crate) use error::{
    CapError, LimitsError, PodLookupError, PodResourcesError, PreStartError, RecoverError,
};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
pub(crate) use owners::Owners;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::{
    config::DmemMode,
    gpud::SessionError,
    hami::{
        ALLOCATED_KEY, ContainerDevice, DevicesAnnotation, containers::entry_containers,
        parse_pod_devices,
    },
    inventory::Snapshot,
    kube::{Events, Regarding},
};

const MIB: u64 = 1024 * 1024;

/// Sets a pod's VRAM limits (amd-gpud's `SetPodVramLimits`).
pub(crate) trait CapSink: Send + Sync + fmt::Debug {
    /// Whether amd-gpud reports its dmem backend on.
    fn backend_on(&self) -> bool;

    /// Sets `limits` (PCI address -> bytes) on pod `uid`.
    fn set(
        &self,
        uid: String,
        limits: BTreeMap<String, u64>,
    ) -> Pin<Box<dyn Future<Output = Result<(), SessionError>> + Send>>;
}

/// Finds a pod of this node by name (and uid, when given): Allocate's
/// knowledge ahead of the watch cache, the cache, then the API server.
pub(crate) trait PodLookup: Send + Sync {
    /// The pod, or why it cannot be had.
    fn find<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
        uid: Option<&'a str>,
    ) -> Pin<Box<dyn Future<Output = Result<Arc<Pod>, PodLookupError>> + Send + 'a>>;
}

/// Whether `pod` is `namespace/name` (of `uid`, when given).
pub(crate) fn is_pod(pod: &Pod, namespace: &str, name: &str, uid: Option<&str>) -> bool {
    pod.namespace().as_deref() == Some(namespace)
        && pod.name_any() == name
        && uid.is_none_or(|u| pod.metadata.uid.as_deref() == Some(u))
}

/// The PreStartContainer side of VRAM caps.
#[derive(Clone)]
pub(crate) struct VramCaps {
    pub(crate) mode: DmemMode,
    pub(crate) sink: Arc<dyn CapSink>,
    pub(crate) owners: Arc<Owners>,
    pub(crate) pods: Arc<dyn PodLookup>,
    pub(crate) snapshots: watch::Receiver<Snapshot>,
    pub(crate) events: Option<Events>,
    /// `--split-count`, to tell which GPU HAMi's (up to v2.9)
    /// `<node>-AMDGPU-<n>` names.
    pub(crate) split_count: u32,
}

impl fmt::Debug for VramCaps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VramCaps")
            .field("mode", &self.mode)
            .field("sink", &self.sink)
            .finish_non_exhaustive()
    }
}

impl VramCaps {
    /// Whether kubelet must call PreStartContainer: `on`, or `auto` with
    /// amd-gpud's backend on.
    pub(crate) fn pre_start_required(&self) -> bool {
        match self.mode {
            DmemMode::Off => false,
            DmemMode::On => true,
            DmemMode::Auto => self.sink.backend_on(),
        }
    }

    /// Applies the cap of the pod owning `ids`; `mandatory` when the
    /// container has no memory hook (the loader check left it out), so the
    /// cap is its only VRAM limit.
    ///
    /// # Errors
    /// With `--dmem-backend on` or `mandatory`: the reason, for kubelet.
    pub(crate) async fn pre_start(
        &self,
        ids: &[String],
        mandatory: bool,
    ) -> Result<(), PreStartError> {
        if !self.pre_start_required() {
            return Ok(());
        }
        let Err(err) = self.apply(ids).await else {
            return Ok(());
        };
        if self.mode == DmemMode::On || mandatory {
            warn!("PreStartContainer refused: {err}");
            let why = if mandatory {
                "the container has no memory hook, so the cap is its only VRAM limit"
            } else {
                "--dmem-backend on makes this fatal"
            };
            return Err(PreStartError { cap: err, why });
        }
        warn!("VRAM cap not applied, the container starts without it: {err}");
        if let (Some(events), Some(pod)) = (&self.events, self.owners.get(ids)) {
            let regarding = Regarding::Pod {
                namespace: pod.namespace,
                name: pod.name,
                uid: pod.uid,
            };
            events.warning(
                &regarding,
                "VramCapNotApplied",
                "PreStartContainer",
                err.to_string(),
            );
        }
        Ok(())
    }

    async fn apply(&self, ids: &[String]) -> Result<(), CapError> {
        let owner = match self.owners.get(ids) {
            Some(owner) => owner,
            None => self.owners.recover(ids, self.pods.as_ref()).await?,
        };
        let who = format!("{}/{}", owner.namespace, owner.name);
        let pod = self
            .pods
            .find(&owner.namespace, &owner.name, Some(&owner.uid))
            .await
            .map_err(|source| CapError::BadPod {
                pod: who.clone(),
                source: source.into(),
            })?;
        let starting = self.owners.container(ids);
        let resource = self.owners.resource();
        let snapshot = self.snapshots.borrow().clone();
        let limits = pod_limits(
            &pod,
            (&snapshot, self.split_count),
            resource,
            starting.as_deref(),
        )
        .map_err(|source| CapError::BadPod {
            pod: who.clone(),
            source: source.into(),
        })?;
        if limits.is_empty() {
            return Ok(());
        }
        let uid = pod.uid().unwrap_or_default();
        self.sink
            .set(uid, limits.clone())
            .await
            .map_err(|source| CapError::Refused {
                pod: who.clone(),
                source,
            })?;
        info!(pod = %who, container = ?starting, ?limits, "VRAM cap set");
        Ok(())
    }
}

/// The pod's VRAM cap per GPU PCI address, in bytes, from the start of its
/// container `starting` on ([`phase::cap`]): what its containers that run
/// at once from then on were granted (`hami.io/amd-devices-allocated`, MiB),
/// never more than HAMi counts for the pod. When the pod spec's containers
/// asking for `resource` do not match HAMi's entries, the sum of every
/// grant (each container's own limit still holds through the hook).
///
/// # Errors
/// When the annotation is missing or malformed, names a GPU this node does
/// not have, or a sum overflows.
pub(crate) fn pod_limits(
    pod: &Pod,
    (snapshot, split_count): (&Snapshot, u32),
    resource: &str,
    starting: Option<&str>,
) -> Result<BTreeMap<String, u64>, LimitsError> {
    let value = pod
        .annotations()
        .get(ALLOCATED_KEY)
        .ok_or(LimitsError::NoAnnotation)?;
    let containers = parse_pod_devices(DevicesAnnotation::Allocated, value)?;
    let grants = containers
        .iter()
        .filter(|c| !c.is_empty())
        .map(|devices| grant_of(devices, snapshot, split_count))
        .collect::<Result<Vec<_>, _>>()?;
    match entry_containers(pod, resource, grants.len()) {
        Some(listed) => Ok(phase::cap(&grants, &listed, starting)),
        None => {
            let mut total = BTreeMap::new();
            for (region, bytes) in grants.iter().flatten() {
                let sum: &mut u64 = total.entry(region.clone()).or_default();
                *sum = sum
                    .checked_add(*bytes)
                    .ok_or_else(|| LimitsError::Overflow {
                        region: region.clone(),
                    })?;
            }
            Ok(total)
        }
    }
}

/// One container's grant per region (the GPU's PCI address), in bytes.
fn grant_of(
    devices: &[ContainerDevice],
    snapshot: &Snapshot,
    split_count: u32,
) -> Result<phase::Grant, LimitsError> {
    let mut grant = phase::Grant::new();
    // A grant made under an older name of a device counts on that device.
    let aliases =
        crate::inventory::ids::Aliases::of(snapshot).with_hami_indices(snapshot, split_count);
    for device in devices {
        let current = aliases
            .resolve(&device.uuid)
            .map_err(LimitsError::Unresolved)?;
        let gpu = snapshot
            .device(&current)
            .ok_or_else(|| LimitsError::GpuNotHere {
                gpu: current.clone(),
            })?;
        let bytes = u64::from(device.usedmem)
            .checked_mul(MIB)
            .ok_or(LimitsError::TooLarge {
                mib: device.usedmem,
            })?;
        // A compute partition's VRAM is capped in its GPU's region.
        let region = gpu.physical_bdf().to_owned();
        let sum: &mut u64 = grant.entry(region.clone()).or_default();
        *sum = sum
            .checked_add(bytes)
            .ok_or(LimitsError::Overflow { region })?;
    }
    Ok(grant)
}

#[cfg(test)]
mod tests;
