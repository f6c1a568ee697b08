//! The plugin's own model of a device: one device of the node as kubelet
//! and HAMi see it, a whole GPU or (in partition mode) one compute
//! partition of a GPU, built once per snapshot from amd-gpud's
//! [`GpuInfo`] (and [`PartitionInfo`]).
//!
//! The wire types stay amd-gpud's: everything the plugin reads of a device
//! is here, typed (health, modes), with the id kubelet and HAMi know it by
//! computed once ([`gpu_id`]'s rules) and its physical GPU's PCI address
//! beside its own.

use ipc::{
    ComputeMode, Health, MemoryMode,
    types::{GpuInfo, Link, PartitionInfo, PartitionProfile},
};

/// The peers of `links` that are XGMI links (KFD io_links or p2p_links of
/// CRAT type 11, as amd-gpud names them), sorted and without repeats.
fn xgmi_peers(links: &[Link]) -> Vec<String> {
    let peers = links.iter().filter(|l| l.link_type == "xgmi");
    let peers: std::collections::BTreeSet<&str> = peers.map(|l| l.peer.as_str()).collect();
    peers.into_iter().map(str::to_owned).collect()
}

/// Whether a device is a whole GPU or one compute partition of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A whole GPU, shared by CU masks.
    Whole,
    /// Compute partition `index` of its GPU, allocated whole; its id is
    /// `<GPU id>-<mode><index>` ([`partition_id`]).
    Partition {
        /// The partition's index within its GPU.
        index: u32,
    },
}

/// One device of the node: what kubelet's devices, HAMi's register entry,
/// Allocate, VRAM caps, metrics and Events are built from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Device {
    /// The id kubelet and HAMi know it by (its slots are `<id>#<n>`).
    pub(crate) id: String,
    /// Its own PCI address (a partition's from KFD): the key of its
    /// partitions in the snapshot.
    pub(crate) bdf: String,
    /// Its physical GPU's PCI address: its own for a whole GPU. VRAM caps
    /// and the per-GPU facts are keyed by it.
    pub(crate) gpu_bdf: String,
    /// Whole GPU or compute partition.
    pub(crate) kind: Kind,
    /// Its health (a partition's own when that is not healthy, else its GPU's).
    pub(crate) health: Health,
    /// Why it is not healthy; empty while healthy.
    pub(crate) health_reason: String,
    /// ROCr's `GPU-<16 hex digits>`; empty without one (and for a
    /// partition, which shares its GPU's and is selected by index).
    pub(crate) rocr_uuid: String,
    /// AMD SMI's device UUID of a whole GPU; empty without it and for a
    /// partition.
    pub(crate) amdsmi_uuid: String,
    /// The GPU's KFD `unique_id`, decimal.
    pub(crate) unique_id: String,
    /// gfx target (`gfx942`); empty when unknown.
    pub(crate) gfx: String,
    /// Market name from AMD SMI; empty without it.
    pub(crate) market_name: String,
    /// Active compute units (a partition's share of its GPU's).
    pub(crate) compute_units: u32,
    /// 2 from gfx10 on (CU masks keep pairs), else 1.
    pub(crate) cus_per_wgp: u32,
    /// VRAM in bytes (a partition's share); 0 when unknown.
    pub(crate) vram_bytes: u64,
    /// NUMA node; -1 when unknown.
    pub(crate) numa_node: i32,
    /// The GPU's current compute partition mode; `None` without one.
    pub(crate) compute_mode: Option<ComputeMode>,
    /// The GPU's current memory partition mode; `None` without one.
    pub(crate) memory_mode: Option<MemoryMode>,
    /// Compute partition modes the GPU offers in its memory mode.
    pub(crate) available_compute_modes: Vec<ComputeMode>,
    /// The GPU's compute-partition profiles in its memory mode.
    pub(crate) partition_profiles: Vec<PartitionProfile>,
    /// Links to the other GPUs, by their PCI address; none for a partition.
    pub(crate) links: Vec<Link>,
    /// The PCI addresses of the GPUs its physical GPU reaches over XGMI
    /// (a partition keeps its GPU's), sorted.
    pub(crate) xgmi_peers: Vec<String>,
}

impl Device {
    /// The whole GPU amd-gpud describes as `gpu`.
    pub(crate) fn whole(gpu: &GpuInfo) -> Self {
        Self {
            id: gpu_id(gpu),
            bdf: gpu.bdf.clone(),
            gpu_bdf: gpu.bdf.clone(),
            kind: Kind::Whole,
            health: gpu.health_status(),
            health_reason: gpu.health_reason.clone(),
            rocr_uuid: gpu.rocr_uuid.clone(),
            amdsmi_uuid: gpu.amdsmi_uuid.clone(),
            unique_id: gpu.unique_id.clone(),
            gfx: gpu.gfx.clone(),
            market_name: gpu.market_name.clone(),
            compute_units: gpu.compute_units,
            cus_per_wgp: gpu.cus_per_wgp,
            vram_bytes: gpu.vram_bytes,
            numa_node: gpu.numa_node,
            compute_mode: gpu.compute_mode(),
            memory_mode: gpu.memory_mode(),
            available_compute_modes: gpu.available_compute_modes(),
            partition_profiles: gpu.partition_profiles.clone(),
            links: gpu.links.clone(),
            xgmi_peers: xgmi_peers(&gpu.links),
        }
    }

    /// Partition `part` of the whole GPU `gpu` in `mode`, as a device of its
    /// own: keyed by the partition's PCI address, with `1 / count` of the
    /// GPU's CUs and VRAM (rounded down), no ROCr UUID and no links.
    pub(crate) fn partition(
        gpu: &Self,
        mode: &ComputeMode,
        part: &PartitionInfo,
        count: u32,
    ) -> Self {
        let count = count.max(1);
        let id = partition_id(&gpu.id, mode, part.index);
        Self {
            id: if clean(&id) { id } else { bdf_id(&part.bdf) },
            bdf: part.bdf.clone(),
            gpu_bdf: gpu.bdf.clone(),
            kind: Kind::Partition { index: part.index },
            health: match part.health_status() {
                Health::Healthy => gpu.health.clone(),
                other => other,
            },
            rocr_uuid: String::new(),
            amdsmi_uuid: String::new(),
            compute_units: gpu.compute_units / count,
            vram_bytes: gpu.vram_bytes / u64::from(count),
            links: Vec::new(),
            ..gpu.clone()
        }
    }

    /// Whether it is a compute partition allocated whole.
    pub(crate) fn is_partition(&self) -> bool {
        matches!(self.kind, Kind::Partition { .. })
    }

    /// Its physical GPU's PCI address.
    pub(crate) fn physical_bdf(&self) -> &str {
        &self.gpu_bdf
    }

    /// Its compute partition mode as the wire named it; empty without one.
    pub(crate) fn compute_mode_str(&self) -> &str {
        self.compute_mode.as_ref().map_or("", ComputeMode::as_str)
    }
}

/// Whether `id` can be a device id: not empty, free of HAMi's separators
/// (`,` `:` `;`) and of the slot separator `#`.
fn clean(id: &str) -> bool {
    !id.is_empty() && !id.contains([',', ':', ';', '#'])
}

/// The id derived from a PCI address: `amdgpu-0000-05-00-0`.
pub(crate) fn bdf_id(bdf: &str) -> String {
    format!("amdgpu-{}", bdf.replace([':', '.'], "-"))
}

/// The id a GPU is known by to kubelet and HAMi: the one amd-gpud publishes
/// it under (chosen once and kept across AMD SMI failures and restarts,
/// gpud/src/published_ids.rs); from an amd-gpud too old to say, the AMD SMI
/// UUID, the ROCr UUID or the PCI address, whichever is there.
pub(crate) fn gpu_id(gpu: &GpuInfo) -> String {
    [&gpu.published_id, &gpu.amdsmi_uuid, &gpu.rocr_uuid]
        .into_iter()
        .find(|id| clean(id))
        .cloned()
        .unwrap_or_else(|| bdf_id(&gpu.bdf))
}

/// The id of partition `index` of the GPU known as `gpu_id` in `mode`.
pub(crate) fn partition_id(gpu_id: &str, mode: &ComputeMode, index: u32) -> String {
    format!("{gpu_id}-{}{index}", mode.as_str().to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{mi300x, partition};

    #[test]
    fn the_id_is_the_first_clean_name_else_the_pci_address() {
        let mut gpu = mi300x("0000:05:00.0", "GPU-1");
        assert_eq!(gpu_id(&gpu), "GPU-1");
        gpu.amdsmi_uuid = "6eff74a1".into();
        assert_eq!(gpu_id(&gpu), "6eff74a1");
        gpu.published_id = "a:b".into();
        assert_eq!(gpu_id(&gpu), "6eff74a1", "HAMi's separators are refused");
        gpu.published_id = "P".into();
        assert_eq!(Device::whole(&gpu).id, "P");
        let bare = mi300x("0000:05:00.0", "");
        assert_eq!(gpu_id(&bare), "amdgpu-0000-05-00-0");
    }

    #[test]
    fn a_partition_takes_its_share_and_its_gpus_health_unless_its_own_is_worse() {
        let mut gpu = mi300x("0000:05:00.0", "GPU-1");
        gpu.health = ipc::UNHEALTHY.into();
        let whole = Device::whole(&gpu);
        let mut part = partition("0000:05:00.0", 3, 0);
        part.bdf = "0000:05:00.3".into();
        let device = Device::partition(&whole, &ComputeMode::Cpx, &part, 8);
        assert_eq!(device.id, "GPU-1-cpx3");
        assert_eq!(
            (device.bdf.as_str(), device.physical_bdf()),
            ("0000:05:00.3", "0000:05:00.0")
        );
        assert_eq!(device.kind, Kind::Partition { index: 3 });
        assert_eq!((device.compute_units, device.vram_bytes), (38, 24 << 30));
        assert_eq!(device.health, Health::Unhealthy, "the GPU's");
        part.health = ipc::MISSING.into();
        let device = Device::partition(&whole, &ComputeMode::Cpx, &part, 8);
        assert_eq!(device.health, Health::Missing, "its own");
        let odd = Device::partition(&whole, &ComputeMode::Other("a:b".into()), &part, 8);
        assert_eq!(
            odd.id, "amdgpu-0000-05-00-3",
            "an id HAMi cannot parse is not used"
        );
    }
}
