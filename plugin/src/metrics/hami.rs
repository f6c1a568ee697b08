//! HAMi's vGPU monitor series for AMD (Project-HAMi/HAMi:cmd/vGPUmonitor/metrics.go):
//! the same names, labels and units, from what amd-gpud measured
//! (`GetUsage`, [`crate::gpud::usage`]) joined with the grants HAMi made
//! (`hami.io/amd-devices-allocated`, `hami.io/amd-cu-allocated`), plus
//! series of ours for what HAMi has no name for.
//!
//! | metric | labels | value |
//! | --- | --- | --- |
//! | `hami_host_gpu_memory_used_bytes` | `node`, `device_index`, `device_uuid`, `device_type`, `zone` | VRAM used on the GPU, bytes |
//! | `hami_host_gpu_utilization_ratio` | same | GPU activity, 0-100 (as HAMi's) |
//! | `hami_vgpu_memory_used_bytes` | `namespace`, `pod`, `container`, `vdevice_index`, `device_uuid`, `zone` | VRAM the container's processes hold on the device (KFD), bytes |
//! | `hami_vgpu_memory_limit_bytes` | same | VRAM HAMi granted the container on the device, bytes |
//! | `amdgpu_dp_container_compute_units` | same, without `zone` | CUs granted |
//! | `amdgpu_dp_pod_cu_mask_info` | `namespace`, `pod`, `device_uuid`, `mask` | 1; `mask` is the pod's CU list on the device (union over its containers) |
//! | `amdgpu_dp_pod_vram_charged_bytes` | `namespace`, `pod`, `pci_bdf` | the pod cgroup's `dmem.current` |
//! | `amdgpu_dp_gpu_temperature_celsius` | `gpu`, `pci_bdf` | |
//! | `amdgpu_dp_gpu_power_watts` | `gpu`, `pci_bdf` | average socket power |
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
    collections::HashMap,
    sync::{Arc, atomic::AtomicU64},
};

use ipc::usage::Usage;
use k8s_openapi::api::core::v1::Pod;
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use self::join::Devices;
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
struct GpuLabels {
    gpu: String,
    pci_bdf: String,
}

type FloatGauge = Gauge<f64, AtomicU64>;

/// The usage series.
#[derive(Debug, Default)]
pub(crate) struct HamiMetrics {
    host_memory: Family<HostLabels, Gauge>,
    host_utilization: Family<HostLabels, Gauge>,
    vgpu_used: Family<ContainerLabels, Gauge>,
    vgpu_limit: Family<ContainerLabels, Gauge>,
    container_cus: Family<ContainerLabels, Gauge>,
    cu_mask: Family<MaskLabels, Gauge>,
    charged: Family<ChargedLabels, Gauge>,
    temperature: Family<GpuLabels, FloatGauge>,
    power: Family<GpuLabels, FloatGauge>,
}

#[cfg(test)]
/// Every series name this module exports (the dashboard check reads them).
pub(crate) const SERIES: [&str; 9] = [
    "hami_host_gpu_memory_used_bytes",
    "hami_host_gpu_utilization_ratio",
    "hami_vgpu_memory_used_bytes",
    "hami_vgpu_memory_limit_bytes",
    "amdgpu_dp_container_compute_units",
    "amdgpu_dp_pod_cu_mask_info",
    "amdgpu_dp_pod_vram_charged_bytes",
    "amdgpu_dp_gpu_temperature_celsius",
    "amdgpu_dp_gpu_power_watts",
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
        hami.register(
            "hami_host_gpu_memory_used_bytes",
            "GPU device memory usage in bytes",
            self.host_memory.clone(),
        );
        hami.register(
            "hami_host_gpu_utilization_ratio",
            "GPU core utilization ratio (0-100)",
            self.host_utilization.clone(),
        );
        hami.register(
            "hami_vgpu_memory_used_bytes",
            "vGPU device memory usage in bytes",
            self.vgpu_used.clone(),
        );
        hami.register(
            "hami_vgpu_memory_limit_bytes",
            "vGPU device memory limit in bytes",
            self.vgpu_limit.clone(),
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
        ours.register(
            "gpu_temperature_celsius",
            "Temperature of each GPU",
            self.temperature.clone(),
        );
        ours.register(
            "gpu_power_watts",
            "Average power of each GPU",
            self.power.clone(),
        );
    }

    /// Sets every series from `inputs`; what is no longer there loses its
    /// series.
    pub(crate) fn observe(&self, inputs: &Inputs<'_>) {
        self.host_memory.clear();
        self.host_utilization.clear();
        self.temperature.clear();
        self.power.clear();
        self.vgpu_used.clear();
        self.vgpu_limit.clear();
        self.container_cus.clear();
        self.cu_mask.clear();
        self.charged.clear();
        if let Some(usage) = inputs.usage {
            self.observe_gpus(inputs, usage);
        }
        let devices = Devices::of(inputs.snapshot);
        for pod in inputs.pods.iter().filter(|p| live(p)) {
            self.observe_pod(pod, &devices, inputs.usage);
        }
    }

    fn observe_gpus(&self, inputs: &Inputs<'_>, usage: &Usage) {
        let by_bdf: HashMap<&str, &Device> = inputs
            .snapshot
            .devices()
            .iter()
            .map(|g| (g.bdf.as_str(), g))
            .collect();
        for (index, used) in usage.gpus.iter().enumerate() {
            let gpu = by_bdf.get(used.bdf.as_str());
            let uuid = gpu.map_or_else(|| used.bdf.clone(), |g| g.id.clone());
            let labels = HostLabels {
                node: inputs.node.to_owned(),
                device_index: index.to_string(),
                device_uuid: uuid.clone(),
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
            let ours = GpuLabels {
                gpu: uuid,
                pci_bdf: used.bdf.clone(),
            };
            #[allow(clippy::cast_precision_loss)]
            if used.temperature_millicelsius >= 0 {
                let celsius = used.temperature_millicelsius as f64 / 1000.0;
                self.temperature.get_or_create(&ours).set(celsius);
            }
            #[allow(clippy::cast_precision_loss)]
            if used.power_microwatts >= 0 {
                let watts = used.power_microwatts as f64 / 1e6;
                self.power.get_or_create(&ours).set(watts);
            }
        }
    }
}
