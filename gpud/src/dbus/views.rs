//! Wire-ready snapshots of GPUs and partitions, built from the registry, and
//! the property maps used to announce what changed.

use std::collections::{BTreeMap, HashMap};

use ipc::{
    gpu_path, partition_path,
    types::{GpuInfo, Link, PartitionInfo, RestoreLink},
};
use zbus::zvariant::Value;

use crate::{
    inventory::{Gpu, GpuLink, LinkVia, Partition, RestoreProps},
    service::{Registry, Shown},
    topology::LinkType,
};

/// Every property of a GPU object: the same type the client decodes.
pub type GpuView = GpuInfo;

/// Every property of a partition object.
pub type PartitionView = PartitionInfo;

fn signed(value: Option<u32>) -> i32 {
    value.and_then(|v| i32::try_from(v).ok()).unwrap_or(-1)
}

fn narrow(value: u64) -> u32 {
    u32::try_from(value).unwrap_or(u32::MAX)
}

fn link(l: &GpuLink) -> Link {
    Link {
        peer: l.peer.to_string(),
        link_type: link_type(l.link_type),
        via: match l.via {
            LinkVia::IoLink => "io_link",
            LinkVia::P2pLink => "p2p_link",
            LinkVia::Host => "host",
        }
        .to_owned(),
        weight: l.weight.unwrap_or(0),
        hops: l.hops.unwrap_or(0),
    }
}

/// A GPU's view.
pub fn gpu_view(gpu: &Gpu, shown: &Shown, registry: &Registry) -> GpuView {
    let bdf = gpu.bdf.to_string();
    GpuView {
        partitions: registry
            .partition_indices(gpu.bdf)
            .into_iter()
            .map(|i| partition_path(&bdf, i))
            .collect(),
        rocr_uuid: gpu.rocr_uuid.clone().unwrap_or_default(),
        unique_id: gpu.unique_id.to_string(),
        gfx: gpu.gfx.map(|g| g.to_string()).unwrap_or_default(),
        compute_units: gpu.compute_units,
        cus_per_wgp: gpu.cus_per_wgp,
        vram_bytes: gpu.vram_bytes,
        numa_node: signed(gpu.numa_node),
        market_name: gpu.market_name.clone().unwrap_or_default(),
        amdsmi_uuid: gpu.amdsmi_uuid.clone().unwrap_or_default(),
        published_id: gpu.published_id.clone().unwrap_or_default(),
        vendor_id: narrow(gpu.vendor_id),
        device_id: narrow(gpu.device_id),
        compute_partition: gpu.compute_partition.clone().unwrap_or_default(),
        memory_partition: gpu.memory_partition.clone().unwrap_or_default(),
        available_compute_partitions: gpu.available_compute_partitions.clone(),
        health: shown.health.as_str().to_owned(),
        health_reason: shown.reason.clone(),
        links: gpu.links.iter().map(link).collect(),
        partition_profiles: crate::partition::profiles(gpu),
        bdf,
    }
}

/// A partition's view.
pub fn partition_view(part: &Partition, shown: &Shown, gpu_bdf: &str) -> PartitionView {
    PartitionView {
        index: part.index,
        kfd_node: part.kfd_node,
        gpu_id: part.gpu_id.unwrap_or(0),
        render_minor: part.render_minor.unwrap_or(0),
        card_minor: signed(part.card_minor),
        bdf: part.bdf.to_string(),
        compute_units: part.compute_units,
        num_xcc: part.num_xcc,
        vram_bytes: part.vram_bytes,
        xcp: signed(part.xcp),
        gpu: gpu_path(gpu_bdf),
        health: shown.health.as_str().to_owned(),
        health_reason: shown.reason.clone(),
        restore_props: restore_props(&part.restore),
        restore_links: part
            .restore
            .io_links
            .iter()
            .map(|l| RestoreLink {
                link_type: link_type(l.link_type),
                node_to: l.node_to,
            })
            .collect(),
    }
}

/// The values CRIU's amdgpu plugin compares (and the ones it saves but does
/// not compare), by KFD property name.
fn restore_props(r: &RestoreProps) -> BTreeMap<String, u64> {
    [
        ("fw_version", r.fw_version),
        ("sdma_fw_version", r.sdma_fw_version),
        ("caches_count", r.caches_count),
        ("num_gws", r.num_gws),
        ("vram_size", r.vram_size),
        ("capability", r.capability),
        ("simd_count", r.simd_count),
        ("mem_banks_count", r.mem_banks_count),
        ("io_links_count", r.io_links_count),
        ("max_waves_per_simd", r.max_waves_per_simd),
        ("lds_size_in_kb", r.lds_size_in_kb),
        ("wave_front_size", r.wave_front_size),
        ("array_count", r.array_count),
        ("simd_arrays_per_engine", r.simd_arrays_per_engine),
        ("cu_per_simd_array", r.cu_per_simd_array),
        ("simd_per_cu", r.simd_per_cu),
        ("max_slots_scratch_cu", r.max_slots_scratch_cu),
        ("vendor_id", r.vendor_id),
        ("device_id", r.device_id),
        ("num_sdma_engines", r.num_sdma_engines),
        ("num_sdma_xgmi_engines", r.num_sdma_xgmi_engines),
        ("num_sdma_queues_per_engine", r.num_sdma_queues_per_engine),
        ("num_cp_queues", r.num_cp_queues),
        ("vram_public", u64::from(r.vram_public)),
        ("domain", r.domain),
        ("drm_render_minor", r.drm_render_minor),
        ("hive_id", r.hive_id),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

fn link_type(t: LinkType) -> String {
    match t {
        LinkType::Pcie => "pcie".to_owned(),
        LinkType::Xgmi => "xgmi".to_owned(),
        LinkType::Other(t) => format!("other-{t}"),
    }
}

/// The properties of `new` that differ from `old`.
pub fn changed(
    old: Vec<(&'static str, Value<'static>)>,
    new: Vec<(&'static str, Value<'static>)>,
) -> HashMap<&'static str, Value<'static>> {
    new.into_iter()
        .zip(old)
        .filter(|((_, n), (_, o))| n != o)
        .map(|((name, value), _)| (name, value))
        .collect()
}
