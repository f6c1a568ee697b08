//! Wire-ready snapshots of GPUs and partitions, built from the registry, and
//! the property maps used to announce what changed.

use std::collections::HashMap;

use ipc::{
    gpu_path, partition_path,
    types::{GpuInfo, Link, PartitionInfo},
};
use zbus::zvariant::Value;

use crate::{
    inventory::{Gpu, GpuLink, LinkVia, Partition},
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
        link_type: match l.link_type {
            LinkType::Pcie => "pcie".to_owned(),
            LinkType::Xgmi => "xgmi".to_owned(),
            LinkType::Other(t) => format!("other-{t}"),
        },
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
        vendor_id: narrow(gpu.vendor_id),
        device_id: narrow(gpu.device_id),
        compute_partition: gpu.compute_partition.clone().unwrap_or_default(),
        memory_partition: gpu.memory_partition.clone().unwrap_or_default(),
        available_compute_partitions: gpu.available_compute_partitions.clone(),
        health: shown.health.to_owned(),
        health_reason: shown.reason.clone(),
        links: gpu.links.iter().map(link).collect(),
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
        health: shown.health.to_owned(),
        health_reason: shown.reason.clone(),
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
