//! The GPU and partition objects: read-only properties over a view.

use std::collections::HashMap;

use ipc::types::{Link, RestoreLink};
use zbus::{interface, zvariant::OwnedObjectPath};

use super::views::{GpuView, PartitionView};

/// `io.hami.AmdGpu1.Gpu` on `/io/hami/AmdGpu1/gpu/<bdf>`.
pub struct GpuObject {
    pub view: GpuView,
}

#[interface(name = "io.hami.AmdGpu1.Gpu")]
impl GpuObject {
    /// PCI address of the physical GPU.
    #[zbus(property)]
    fn bdf(&self) -> String {
        self.view.bdf.clone()
    }
    /// ROCr's `GPU-<16 hex digits>`; empty when the GPU has no unique id.
    #[zbus(property)]
    fn rocr_uuid(&self) -> String {
        self.view.rocr_uuid.clone()
    }
    /// KFD `unique_id`, decimal.
    #[zbus(property)]
    fn unique_id(&self) -> String {
        self.view.unique_id.clone()
    }
    /// gfx target (`gfx942`); empty when unknown.
    #[zbus(property)]
    fn gfx(&self) -> String {
        self.view.gfx.clone()
    }
    /// Active compute units of the whole GPU.
    #[zbus(property)]
    fn compute_units(&self) -> u32 {
        self.view.compute_units
    }
    /// 2 from gfx10 on (CU masks must keep pairs), else 1.
    #[zbus(property)]
    fn cus_per_wgp(&self) -> u32 {
        self.view.cus_per_wgp
    }
    /// VRAM of the whole GPU in bytes; 0 when unknown.
    #[zbus(property)]
    fn vram_bytes(&self) -> u64 {
        self.view.vram_bytes
    }
    /// NUMA node; -1 when unknown.
    #[zbus(property)]
    fn numa_node(&self) -> i32 {
        self.view.numa_node
    }
    /// Market name from AMD SMI; empty without it.
    #[zbus(property)]
    fn market_name(&self) -> String {
        self.view.market_name.clone()
    }
    /// AMD SMI's device UUID (an opaque label); empty without it.
    #[zbus(property, name = "AmdSmiUuid")]
    fn amdsmi_uuid(&self) -> String {
        self.view.amdsmi_uuid.clone()
    }
    /// The ID the GPU is published under: chosen the first time amd-gpud
    /// saw it and kept across AMD SMI failures and restarts.
    #[zbus(property)]
    fn published_id(&self) -> String {
        self.view.published_id.clone()
    }
    /// PCI vendor id (0x1002).
    #[zbus(property)]
    fn vendor_id(&self) -> u32 {
        self.view.vendor_id
    }
    /// PCI device id.
    #[zbus(property)]
    fn device_id(&self) -> u32 {
        self.view.device_id
    }
    /// Current compute partition mode (`SPX`, `CPX`, ...); empty when none.
    #[zbus(property)]
    fn compute_partition(&self) -> String {
        self.view.compute_partition.clone()
    }
    /// Current memory partition mode (`NPS1`, ...); empty when none.
    #[zbus(property)]
    fn memory_partition(&self) -> String {
        self.view.memory_partition.clone()
    }
    /// Compute partition modes the GPU offers in its memory mode.
    #[zbus(property)]
    fn available_compute_partitions(&self) -> Vec<String> {
        self.view.available_compute_partitions.clone()
    }
    /// `Healthy`, `Unhealthy` or `Missing` (a GPU is unhealthy when one of
    /// its partitions fails its probes).
    #[zbus(property)]
    fn health(&self) -> String {
        self.view.health.clone()
    }
    /// Why the GPU is not healthy, as found when it went out of service;
    /// empty while healthy.
    #[zbus(property)]
    fn health_reason(&self) -> String {
        self.view.health_reason.clone()
    }
    /// Partition objects of this GPU, by index.
    #[zbus(property)]
    fn partitions(&self) -> Vec<OwnedObjectPath> {
        self.view.partitions.clone()
    }
    /// Links to the other GPUs: (peer, type, via, weight, hops).
    #[zbus(property)]
    fn links(&self) -> Vec<Link> {
        self.view.links.clone()
    }

    /// Compute-partition profiles the GPU offers in its memory mode: (index,
    /// mode, memory modes, partitions, XCCs per partition); empty without
    /// compute partitions.
    #[zbus(property)]
    fn partition_profiles(&self) -> Vec<ipc::types::PartitionProfile> {
        self.view.partition_profiles.clone()
    }
}

/// `io.hami.AmdGpu1.Partition` on `/io/hami/AmdGpu1/gpu/<bdf>/partition/<n>`.
pub struct PartitionObject {
    pub view: PartitionView,
}

#[interface(name = "io.hami.AmdGpu1.Partition")]
impl PartitionObject {
    /// Partition index within its GPU (0 when unpartitioned).
    #[zbus(property)]
    fn index(&self) -> u32 {
        self.view.index
    }
    /// KFD topology node index.
    #[zbus(property)]
    fn kfd_node(&self) -> u32 {
        self.view.kfd_node
    }
    /// KFD `gpu_id`; 0 when unknown.
    #[zbus(property)]
    fn gpu_id(&self) -> u64 {
        self.view.gpu_id
    }
    /// DRM render minor (`/dev/dri/renderD<N>`); 0 when none.
    #[zbus(property)]
    fn render_minor(&self) -> u32 {
        self.view.render_minor
    }
    /// DRM card minor; -1 when unknown.
    #[zbus(property)]
    fn card_minor(&self) -> i32 {
        self.view.card_minor
    }
    /// PCI address from KFD `location_id` (the function carries the index).
    #[zbus(property)]
    fn bdf(&self) -> String {
        self.view.bdf.clone()
    }
    /// Active compute units of this partition.
    #[zbus(property)]
    fn compute_units(&self) -> u32 {
        self.view.compute_units
    }
    /// XCCs in this partition.
    #[zbus(property)]
    fn num_xcc(&self) -> u32 {
        self.view.num_xcc
    }
    /// VRAM of this partition in bytes.
    #[zbus(property)]
    fn vram_bytes(&self) -> u64 {
        self.view.vram_bytes
    }
    /// XCP platform device serving the render node; -1 for the PCI function.
    #[zbus(property)]
    fn xcp(&self) -> i32 {
        self.view.xcp
    }
    /// The GPU object this partition belongs to.
    #[zbus(property)]
    fn gpu(&self) -> OwnedObjectPath {
        self.view.gpu.clone()
    }
    /// `Healthy`, `Unhealthy` or `Missing`.
    #[zbus(property)]
    fn health(&self) -> String {
        self.view.health.clone()
    }
    /// What CRIU's amdgpu plugin compares when it restores a checkpoint onto
    /// this KFD node, by KFD property name: fw_version, sdma_fw_version,
    /// caches_count, num_gws, vram_size and capability (relaxed by the
    /// KFD_*_CHECK options), the values always compared for equality
    /// (vram_public as 0/1), and domain, drm_render_minor, hive_id (saved,
    /// not compared).
    #[zbus(property)]
    fn restore_props(&self) -> HashMap<String, u64> {
        self.view.restore_props.clone().into_iter().collect()
    }
    /// The node's PCIe and XGMI io links as CRIU reads them: (type, node_to).
    #[zbus(property)]
    fn restore_links(&self) -> Vec<RestoreLink> {
        self.view.restore_links.clone()
    }

    /// Why the partition is not healthy, as found when it went out of
    /// service; empty while healthy.
    #[zbus(property)]
    fn health_reason(&self) -> String {
        self.view.health_reason.clone()
    }
}
