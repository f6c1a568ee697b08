//! The per-pod half of [`super`]: each live pod's grants joined with
//! the VRAM its containers' processes hold.

use std::collections::{BTreeSet, HashMap};

use ipc::usage::Usage;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

use super::{ChargedLabels, ContainerLabels, HamiMetrics, MaskLabels};
use crate::{
    hami::{
        ALLOCATED_KEY, CU_ALLOCATED_KEY, DevicesAnnotation, parse_cu_allocated, parse_pod_devices,
    },
    inventory::Snapshot,
};

const MIB: u64 = 1024 * 1024;

/// Each device id with the KFD `gpu_id`s behind it (one per partition).
pub(super) struct Devices(HashMap<String, BTreeSet<u64>>);

impl Devices {
    pub(super) fn of(snapshot: &Snapshot) -> Self {
        let ids = snapshot.devices().iter().map(|gpu| {
            let kfd: BTreeSet<u64> = snapshot
                .partitions
                .get(&gpu.bdf)
                .into_iter()
                .flatten()
                .map(|p| p.gpu_id)
                .filter(|&id| id != 0)
                .collect();
            (gpu.id.clone(), kfd)
        });
        Self(ids.collect())
    }

    fn serves(&self, device: &str, kfd_gpu: u64) -> bool {
        self.0.get(device).is_some_and(|ids| ids.contains(&kfd_gpu))
    }
}

/// Container runtime ID (without the `containerd://` scheme) to its name.
fn runtime_ids(pod: &Pod) -> HashMap<&str, &str> {
    let Some(status) = pod.status.as_ref() else {
        return HashMap::new();
    };
    let lists = [&status.container_statuses, &status.init_container_statuses];
    lists
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|s| {
            let id = s.container_id.as_deref()?;
            let id = id.split_once("://").map_or(id, |(_, id)| id);
            Some((id, s.name.as_str()))
        })
        .collect()
}

type Used = HashMap<(String, String), u64>;

/// One container's grant of one device: its series' labels, the device id
/// and the CUs its processes' waves occupy there (KFD's count).
pub(super) type Holder = (ContainerLabels, String, u64);

/// One measured figure of the pod's processes: runtime ID, KFD gpu_id, value.
type Figure<'a> = (&'a str, u64, u64);

/// Figures summed by (container name, device id): a process counts for the
/// container its cgroup names, or, naming none known, for the one holder of
/// the device.
fn attribute<'a>(
    figures: impl Iterator<Item = Figure<'a>>,
    pod: &Pod,
    holders: &HashMap<String, BTreeSet<String>>,
    devices: &Devices,
) -> Used {
    let names = runtime_ids(pod);
    let mut used = Used::new();
    for (container_id, gpu_id, value) in figures {
        for (device, held_by) in holders {
            if !devices.serves(device, gpu_id) {
                continue;
            }
            let named = names
                .get(container_id)
                .filter(|n| held_by.contains(**n))
                .map(|n| (*n).to_owned());
            let only = (held_by.len() == 1)
                .then(|| held_by.first().cloned())
                .flatten();
            if let Some(owner) = named.or(only) {
                let slot = used.entry((owner, device.clone())).or_default();
                *slot = slot.saturating_add(value);
            }
        }
    }
    used
}

/// The pod's VRAM and occupied CUs by (container name, device id).
fn measure(
    usage: &Usage,
    uid: &str,
    pod: &Pod,
    holders: &HashMap<String, BTreeSet<String>>,
    devices: &Devices,
) -> (Used, Used) {
    let vram = usage
        .containers
        .iter()
        .filter(|c| c.pod_uid == uid)
        .map(|c| (c.container_id.as_str(), c.gpu_id, c.vram_bytes));
    let cus = usage
        .compute
        .iter()
        .filter(|c| c.pod_uid == uid)
        .map(|c| (c.container_id.as_str(), c.gpu_id, u64::from(c.cus)));
    (
        attribute(vram, pod, holders, devices),
        attribute(cus, pod, holders, devices),
    )
}

impl HamiMetrics {
    /// Sets the pod's series; returns its grants.
    pub(super) fn observe_pod(
        &self,
        pod: &Pod,
        devices: &Devices,
        usage: Option<&Usage>,
    ) -> Vec<Holder> {
        let Some(value) = pod.annotations().get(ALLOCATED_KEY) else {
            return Vec::new();
        };
        let Ok(entries) = parse_pod_devices(DevicesAnnotation::Allocated, value) else {
            return Vec::new();
        };
        let uid = pod.metadata.uid.as_deref().unwrap_or_default();
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let spec_names: Vec<&str> = pod
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(|c| c.name.as_str()).collect())
            .unwrap_or_default();
        let mut holders: HashMap<String, BTreeSet<String>> = HashMap::new();
        for (container, devs) in spec_names.iter().zip(&entries) {
            for d in devs {
                holders
                    .entry(d.uuid.clone())
                    .or_default()
                    .insert((*container).to_owned());
            }
        }
        let measured = usage.map(|u| measure(u, uid, pod, &holders, devices));
        let mut granted = Vec::new();
        for (container, devs) in spec_names.iter().zip(&entries) {
            for (index, d) in devs.iter().enumerate() {
                let labels = ContainerLabels {
                    namespace: namespace.clone(),
                    pod: name.clone(),
                    container: (*container).to_owned(),
                    vdevice_index: index.to_string(),
                    device_uuid: d.uuid.clone(),
                };
                let limit = u64::from(d.usedmem) * MIB;
                self.vgpu_limit.get_or_create(&labels).set(gauge(limit));
                self.container_cus
                    .get_or_create(&labels)
                    .set(i64::from(d.usedcores));
                let key = ((*container).to_owned(), d.uuid.clone());
                let mut cus = 0;
                if let Some((used, occupied)) = &measured {
                    let bytes = gauge(used.get(&key).copied().unwrap_or(0));
                    self.vgpu_used.get_or_create(&labels).set(bytes);
                    self.container_memory.get_or_create(&labels).set(bytes);
                    cus = occupied.get(&key).copied().unwrap_or(0);
                }
                granted.push((labels, d.uuid.clone(), cus));
            }
        }
        self.observe_pod_extras(pod, (&namespace, &name, uid), usage);
        granted
    }

    fn observe_pod_extras(
        &self,
        pod: &Pod,
        (namespace, name, uid): (&str, &str, &str),
        usage: Option<&Usage>,
    ) {
        let masks = pod
            .annotations()
            .get(CU_ALLOCATED_KEY)
            .and_then(|v| parse_cu_allocated(v).ok());
        for (device, list) in masks.iter().flat_map(|m| &m.0) {
            let labels = MaskLabels {
                namespace: namespace.to_owned(),
                pod: name.to_owned(),
                device_uuid: device.clone(),
                mask: list.to_string(),
            };
            self.cu_mask.get_or_create(&labels).set(1);
        }
        for d in usage
            .iter()
            .flat_map(|u| &u.dmem)
            .filter(|d| d.pod_uid == uid)
        {
            let labels = ChargedLabels {
                namespace: namespace.to_owned(),
                pod: name.to_owned(),
                pci_bdf: d.bdf.clone(),
            };
            self.charged
                .get_or_create(&labels)
                .set(gauge(d.current_bytes));
        }
    }
}

fn gauge(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}
