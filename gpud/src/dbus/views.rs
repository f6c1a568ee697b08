//! Wire-ready snapshots of GPUs and partitions, built from the registry, and
//! the property maps used to announce what changed.

use std::collections::HashMap;

use ipc::{HEALTHY, MISSING, gpu_path, partition_path, types::Link};
use zbus::zvariant::{OwnedObjectPath, Value};

use crate::{
    inventory::{Gpu, GpuLink, LinkVia, Partition},
    service::{Presence, Registry},
    topology::LinkType,
};

/// Every property of a GPU object.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuView {
    pub bdf: String,
    pub rocr_uuid: String,
    pub unique_id: String,
    pub gfx: String,
    pub compute_units: u32,
    pub cus_per_wgp: u32,
    pub vram_bytes: u64,
    pub numa_node: i32,
    pub market_name: String,
    pub amdsmi_uuid: String,
    pub vendor_id: u32,
    pub device_id: u32,
    pub compute_partition: String,
    pub memory_partition: String,
    pub available_compute_partitions: Vec<String>,
    pub health: String,
    pub partitions: Vec<OwnedObjectPath>,
    pub links: Vec<Link>,
}

/// Every property of a partition object.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionView {
    pub index: u32,
    pub kfd_node: u32,
    pub gpu_id: u64,
    pub render_minor: u32,
    pub card_minor: i32,
    pub bdf: String,
    pub compute_units: u32,
    pub num_xcc: u32,
    pub vram_bytes: u64,
    pub xcp: i32,
    pub gpu: OwnedObjectPath,
    pub health: String,
}

fn health(presence: Presence) -> String {
    match presence {
        Presence::Present => HEALTHY,
        Presence::Missing => MISSING,
    }
    .to_owned()
}

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

impl GpuView {
    pub fn new(gpu: &Gpu, presence: Presence, registry: &Registry) -> Self {
        let bdf = gpu.bdf.to_string();
        Self {
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
            health: health(presence),
            links: gpu.links.iter().map(link).collect(),
            bdf,
        }
    }

    /// The properties as `GetAll` returns them, for change announcements.
    pub fn properties(&self) -> Vec<(&'static str, Value<'static>)> {
        vec![
            ("Bdf", self.bdf.clone().into()),
            ("RocrUuid", self.rocr_uuid.clone().into()),
            ("UniqueId", self.unique_id.clone().into()),
            ("Gfx", self.gfx.clone().into()),
            ("ComputeUnits", self.compute_units.into()),
            ("CusPerWgp", self.cus_per_wgp.into()),
            ("VramBytes", self.vram_bytes.into()),
            ("NumaNode", self.numa_node.into()),
            ("MarketName", self.market_name.clone().into()),
            ("AmdSmiUuid", self.amdsmi_uuid.clone().into()),
            ("VendorId", self.vendor_id.into()),
            ("DeviceId", self.device_id.into()),
            ("ComputePartition", self.compute_partition.clone().into()),
            ("MemoryPartition", self.memory_partition.clone().into()),
            (
                "AvailableComputePartitions",
                self.available_compute_partitions.clone().into(),
            ),
            ("Health", self.health.clone().into()),
            ("Partitions", self.partitions.clone().into()),
            ("Links", self.links.clone().into()),
        ]
    }
}

impl PartitionView {
    pub fn new(part: &Partition, presence: Presence, gpu_bdf: &str) -> Self {
        Self {
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
            health: health(presence),
        }
    }

    /// The properties as `GetAll` returns them, for change announcements.
    pub fn properties(&self) -> Vec<(&'static str, Value<'static>)> {
        vec![
            ("Index", self.index.into()),
            ("KfdNode", self.kfd_node.into()),
            ("GpuId", self.gpu_id.into()),
            ("RenderMinor", self.render_minor.into()),
            ("CardMinor", self.card_minor.into()),
            ("Bdf", self.bdf.clone().into()),
            ("ComputeUnits", self.compute_units.into()),
            ("NumXcc", self.num_xcc.into()),
            ("VramBytes", self.vram_bytes.into()),
            ("Xcp", self.xcp.into()),
            ("Gpu", self.gpu.clone().into()),
            ("Health", self.health.clone().into()),
        ]
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
