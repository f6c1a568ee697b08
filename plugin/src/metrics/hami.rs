//! HAMi's vGPU monitor series for AMD (Project-HAMi/HAMi:cmd/vGPUmonitor/metrics.go,
//! and the two host series the Go AMD plugin's monitor adds,
//! Project-HAMi/amd-device-plugin:internal/pkg/vgpumonitor/collector.go):
//! the same names, labels and units, from what amd-gpud measured
//! (`GetUsage`, [`crate::gpud::usage`]) joined with the grants HAMi made
//! (`hami.io/amd-devices-allocated`, `hami.io/amd-cu-allocated`), plus
//! series of ours for what HAMi has no name for. Every `hami_` series also
//! carries HAMi's `zone="vGPU"`. docs/metrics.md lists HAMi's series this
//! node cannot fill, and why.
//!
//! | metric | labels | value |
//! | --- | --- | --- |
//! | `hami_host_gpu_memory_used_bytes` | `node`, `device_index`, `device_uuid`, `device_type` | VRAM used on the GPU, bytes |
//! | `hami_host_gpu_utilization_ratio` | same | GPU activity, 0-100 (as HAMi's) |
//! | `hami_host_gpu_temperature_celsius` | same | edge (or first) temperature |
//! | `hami_host_gpu_power_usage_watts` | same | average socket power |
//! | `hami_vgpu_memory_used_bytes` | `namespace`, `pod`, `container`, `vdevice_index`, `device_uuid` | VRAM the container's processes hold on the device (KFD), bytes |
//! | `hami_container_device_memory_bytes` | same | the same figure (HAMi reports its total twice) |
//! | `hami_vgpu_memory_limit_bytes` | same | VRAM HAMi granted the container on the device, bytes |
//! | `hami_container_device_utilization_ratio` | same | CUs the container's waves occupy (KFD `cu_occupancy`) out of the device's, 0-100; on a node without `cu_occupancy`, the GPU's activity while this container is the only one holding any device of that GPU |
//! | `hami_vgpumonitor_collect_success` | `node` | 1 when amd-gpud answered the last `GetUsage`, else 0 |
//! | `amdgpu_dp_container_compute_units` | same as `hami_vgpu_*`, without `zone` | CUs granted |
//! | `amdgpu_dp_pod_cu_mask_info` | `namespace`, `pod`, `device_uuid`, `mask` | 1; `mask` is the pod's CU list on the device (union over its containers) |
//! | `amdgpu_dp_pod_vram_charged_bytes` | `namespace`, `pod`, `pci_bdf` | the pod cgroup's `dmem.current` |
//!
//! A process's VRAM counts for a container when its cgroup names the
//! container's runtime ID (from the pod's `containerStatuses`), or, when it
//! names none known, for the one container of the pod granted the device;
//! otherwise for no container. Processes outside pod cgroups never reach
//! the plugin.

mod join;
#[cfg(test)]
mod tests;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, atomic::AtomicU64},
};

use ipc::usage::Usage;
use k8s_openapi::api::core::v1::Pod;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use self::join::{Devices, Holder};
use super::usage::live;
use crate::{
    hami::register::DeviceInfo,
    inventory::{Device, Snapshot},
    register::entries::product_name,
};

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct HostLabels {
    node: String,
    device_index: String,
    device_uuid: String,
    device_type: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
struct ContainerLabels {
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) container: String,
    pub(crate) vdevice_index: String,
    pub(crate) device_uuid: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct MaskLabels {
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) device_uuid: String,
    pub(crate) mask: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ChargedLabels {
    pub(crate) namespace: String,
    pub(crate) pod: String,
    pub(crate) pci_bdf: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct NodeLabel {
    node: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The usage series.
#[derive(Debug, Default)]
pub(crate) struct HamiMetrics {
    host_memory: Family<HostLabels, Gauge>,
    host_utilization: Family<HostLabels, Gauge>,
    temperature: Family<HostLabels, FloatGauge>,
    power: Family<HostLabels, FloatGauge>,
    vgpu_used: Family<ContainerLabels, Gauge>,
    container_memory: Family<ContainerLabels, Gauge>,
    vgpu_limit: Family<ContainerLabels, Gauge>,
    container_utilization: Family<ContainerLabels, Gauge>,
    collect_success: Family<NodeLabel, Gauge>,
    container_cus: Family<ContainerLabels, Gauge>,
    cu_mask: Family<MaskLabels, Gauge>,
    charged: Family<ChargedLabels, Gauge>,
}

/// HAMi's series this module exports: those of HAMi's vGPU monitor AMD can
/// fill, and the Go AMD plugin's host temperature, power and collection
/// status (the metrics tests hold the scrape to this list).
pub const HAMI_SERIES: [&str; 9] = [
    "hami_host_gpu_memory_used_bytes",
    "hami_host_gpu_utilization_ratio",
    "hami_host_gpu_temperature_celsius",
    "hami_host_gpu_power_usage_watts",
    "hami_vgpu_memory_used_bytes",
    "hami_container_device_memory_bytes",
    "hami_vgpu_memory_limit_bytes",
    "hami_container_device_utilization_ratio",
    "hami_vgpumonitor_collect_success",
];

/// HAMi's vGPU monitor series AMD cannot fill (docs/metrics.md says why):
/// none of them is ever exported.
pub const HAMI_UNFILLED: [&str; 6] = [
    "hami_host_gpu_memory_controller_utilization_ratio",
    "hami_container_last_kernel_elapsed_seconds",
    "hami_mig_device_info",
    "hami_vgpu_memory_context_bytes",
    "hami_vgpu_memory_module_bytes",
    "hami_vgpu_memory_buffer_bytes",
];

#[cfg(test)]
/// The series of ours this module exports.
pub(crate) const OURS: [&str; 3] = [
    "amdgpu_dp_container_compute_units",
    "amdgpu_dp_pod_cu_mask_info",
    "amdgpu_dp_pod_vram_charged_bytes",
];

/// What one scrape joins.
pub struct Inputs<'a> {
    pub node: &'a str,
    pub snapshot: &'a Snapshot,
    pub pods: &'a [Arc<Pod>],
    /// amd-gpud's last answer; `None` when it gave none.
    pub usage: Option<&'a Usage>,
}

impl HamiMetrics {
    /// Registers HAMi's series in `hami` (no prefix; HAMi's `zone` label).
    pub(crate) fn register_hami(&self, hami: &mut Registry) {
        let host: [(&str, &str, &Family<HostLabels, Gauge>); 2] = [
            (
                "hami_host_gpu_memory_used_bytes",
                "GPU device memory usage in bytes",
                &self.host_memory,
            ),
            (
                "hami_host_gpu_utilization_ratio",
                "GPU core utilization ratio (0-100)",
                &self.host_utilization,
            ),
        ];
        for (name, help, family) in host {
            hami.register(name, help, family.clone());
        }
        hami.register(
            "hami_host_gpu_temperature_celsius",
            "GPU temperature in degrees Celsius",
            self.temperature.clone(),
        );
        hami.register(
            "hami_host_gpu_power_usage_watts",
            "GPU power draw in watts",
            self.power.clone(),
        );
        let containers: [(&str, &str, &Family<ContainerLabels, Gauge>); 4] = [
            (
                "hami_vgpu_memory_used_bytes",
                "vGPU device memory usage in bytes",
                &self.vgpu_used,
            ),
            (
                "hami_vgpu_memory_limit_bytes",
                "vGPU device memory limit in bytes",
                &self.vgpu_limit,
            ),
            (
                "hami_container_device_memory_bytes",
                "Container device memory usage in bytes",
                &self.container_memory,
            ),
            (
                "hami_container_device_utilization_ratio",
                "Container device utilization ratio (0-100): CUs its waves occupy out of the device's (KFD cu_occupancy), else the GPU's activity while the container is its only holder",
                &self.container_utilization,
            ),
        ];
        for (name, help, family) in containers {
            hami.register(name, help, family.clone());
        }
        hami.register(
            "hami_vgpumonitor_collect_success",
            "Whether the last collection got amd-gpud's usage answer (1) or not (0)",
            self.collect_success.clone(),
        );
    }

    /// Registers our series in `ours` (the `amdgpu_dp` prefix).
    pub(crate) fn register_ours(&self, ours: &mut Registry) {
        ours.register(
            "container_compute_units",
            "CUs HAMi granted each container on each device",
            self.container_cus.clone(),
        );
        ours.register(
            "pod_cu_mask_info",
            "The CUs each pod holds on each device (mask label, an ID list): 1",
            self.cu_mask.clone(),
        );
        ours.register(
            "pod_vram_charged_bytes",
            "VRAM charged to each pod's cgroup by the dmem controller (dmem.current)",
            self.charged.clone(),
        );
    }

    /// Sets every series from `inputs`; what is no longer there loses its
    /// series.
    pub(crate) fn observe(&self, inputs: &Inputs<'_>) {
        self.host_memory.clear();
        self.host_utilization.clear();
        self.temperature.clear();
        self.power.clear();
        for family in [
            &self.vgpu_used,
            &self.container_memory,
            &self.vgpu_limit,
            &self.container_utilization,
            &self.container_cus,
        ] {
            family.clear();
        }
        self.cu_mask.clear();
        self.charged.clear();
        self.collect_success.clear();
        let node = NodeLabel {
            node: inputs.node.to_owned(),
        };
        self.collect_success
            .get_or_create(&node)
            .set(i64::from(inputs.usage.is_some()));
        if let Some(usage) = inputs.usage {
            self.observe_gpus(inputs, usage);
        }
        let devices = Devices::of(inputs.snapshot);
        let mut holders = Vec::new();
        for pod in inputs.pods.iter().filter(|p| live(p)) {
            holders.extend(self.observe_pod(pod, &devices, inputs.usage));
        }
        if let Some(usage) = inputs.usage {
            self.observe_utilization(inputs.snapshot, usage, holders);
        }
    }

    /// The `hami_host_gpu_*` series of the GPUs the plugin offers: a GPU
    /// amd-gpud measures that the snapshot leaves out (`--exclude-gpus`) is
    /// the node's own, not HAMi's, and gets none (kept when the snapshot is
    /// empty: no inventory yet says nothing of what is excluded).
    fn observe_gpus(&self, inputs: &Inputs<'_>, usage: &Usage) {
        let by_bdf: HashMap<&str, &Device> = inputs
            .snapshot
            .devices()
            .iter()
            .map(|g| (g.bdf.as_str(), g))
            .collect();
        let offered: HashSet<&str> = inputs
            .snapshot
            .devices()
            .iter()
            .flat_map(|g| [g.bdf.as_str(), g.physical_bdf()])
            .collect();
        for (index, used) in usage.gpus.iter().enumerate() {
            if !offered.is_empty() && !offered.contains(used.bdf.as_str()) {
                continue;
            }
            let gpu = by_bdf.get(used.bdf.as_str());
            let labels = HostLabels {
                node: inputs.node.to_owned(),
                device_index: index.to_string(),
                device_uuid: gpu.map_or_else(|| used.bdf.clone(), |g| g.id.clone()),
                device_type: DeviceInfo::product_type(
                    &gpu.map_or_else(String::new, |g| product_name(g)),
                ),
            };
            if used.vram_used_bytes >= 0 {
                self.host_memory
                    .get_or_create(&labels)
                    .set(used.vram_used_bytes);
            }
            if used.busy_percent >= 0 {
                self.host_utilization
                    .get_or_create(&labels)
                    .set(used.busy_percent);
            }
            #[allow(clippy::cast_precision_loss)]
            if used.temperature_millicelsius >= 0 {
                let celsius = used.temperature_millicelsius as f64 / 1000.0;
                self.temperature.get_or_create(&labels).set(celsius);
            }
            #[allow(clippy::cast_precision_loss)]
            if used.power_microwatts >= 0 {
                let watts = used.power_microwatts as f64 / 1e6;
                self.power.get_or_create(&labels).set(watts);
            }
        }
    }

    /// `hami_container_device_utilization_ratio`, HAMi's percent of the
    /// device (its SM utilization, Project-HAMi/HAMi:cmd/vGPUmonitor/metrics.go):
    /// on a GPU where KFD counts occupied CUs (`cu_occupancy`, any of its
    /// processes in pods answered), the CUs the container's waves occupy out
    /// of the device's CUs, for every holder, shared or not. Elsewhere
    /// amd-gpud measures activity per GPU only, so a container gets its GPU's
    /// figure only while it is the one holder of any device of that GPU
    /// across the node's live pods; a shared GPU's activity is no one
    /// container's, and gets no series.
    fn observe_utilization(&self, snapshot: &Snapshot, usage: &Usage, holders: Vec<Holder>) {
        let counted = counting_gpus(snapshot, usage);
        let mut by_gpu: HashMap<&str, Vec<ContainerLabels>> = HashMap::new();
        for (labels, device, cus) in holders {
            let Some(d) = snapshot.device(&device) else {
                continue;
            };
            if counted.contains(d.bdf.as_str()) {
                let percent = occupied_percent(cus, d.compute_units);
                self.container_utilization
                    .get_or_create(&labels)
                    .set(percent);
            } else {
                by_gpu.entry(d.gpu_bdf.as_str()).or_default().push(labels);
            }
        }
        for used in usage.gpus.iter().filter(|g| g.busy_percent >= 0) {
            if let Some([only]) = by_gpu.get(used.bdf.as_str()).map(Vec::as_slice) {
                self.container_utilization
                    .get_or_create(only)
                    .set(used.busy_percent);
            }
        }
    }
}

/// The devices (their own PCI addresses) for which amd-gpud counted occupied
/// CUs: a `cu_occupancy` of any of their KFD gpu_ids.
fn counting_gpus<'a>(snapshot: &'a Snapshot, usage: &Usage) -> HashSet<&'a str> {
    let ids: HashSet<u64> = usage.compute.iter().map(|c| c.gpu_id).collect();
    snapshot
        .partitions
        .iter()
        .filter(|(_, parts)| parts.iter().any(|p| ids.contains(&p.gpu_id)))
        .map(|(bdf, _)| bdf.as_str())
        .collect()
}

/// `cus` of `of` as a percent, 0-100 (0 when the device's CUs are unknown).
fn occupied_percent(cus: u64, of: u32) -> i64 {
    if of == 0 {
        return 0;
    }
    let percent = (cus.saturating_mul(100) + u64::from(of) / 2) / u64::from(of);
    i64::try_from(percent.min(100)).unwrap_or(100)
}
