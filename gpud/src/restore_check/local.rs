//! This node's side of a restore: the KFD topology as the restoring task
//! would see it.
//!
//! The plugin walks `nodes/` and each node's `io_links/` in
//! directory-listing order (on sysfs a hash order, not numeric) and skips a
//! node
//! whose `gpu_id` it cannot read. A container sees only the GPUs its device
//! cgroup lets it open; CPU nodes are always visible. So the local side is
//! every CPU node plus the GPUs the caller names (all GPUs when none are
//! named), and links to hidden GPUs become invalid, as they would for CRIU.

use std::collections::BTreeSet;

use super::model::{GpuProps, Link, LinkKind, Location, Node, Topo};
use crate::{
    hostpaths::HostPaths,
    inventory::RestoreProps,
    pci::PciAddress,
    topology::{self, KfdNode, LinkType, TopologyError},
};

/// Why the local side cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error(
        "no KFD GPU node matches {id:?} (give a gpu_id, decimal or 0x-hex, renderD<minor>, or a PCI address)"
    )]
    UnknownGpu { id: String },
}

/// The local nodes, and what CRIU would not see.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalTopology {
    /// Every node CRIU would read, in listing order.
    pub topo: Topo,
    pub notes: Vec<String>,
}

/// Reads the KFD topology under `paths`.
///
/// # Errors
/// When the topology directory cannot be read.
pub fn read(paths: &HostPaths) -> Result<LocalTopology, TopologyError> {
    let topology = topology::read_topology(paths)?;
    let mut notes = Vec::new();
    let mut nodes = Vec::with_capacity(topology.nodes.len());
    for index in &topology.listing_order {
        let Some(node) = topology.node(*index) else {
            continue;
        };
        match convert(node) {
            Some(n) => nodes.push(n),
            None => notes.push(format!(
                "KFD node {index} has no readable gpu_id; CRIU skips it"
            )),
        }
    }
    Ok(LocalTopology {
        topo: Topo { nodes },
        notes,
    })
}

/// Keeps the low 32 bits, as CRIU's 32-bit fields do.
fn low32(value: u64) -> u32 {
    u32::try_from(value & u64::from(u32::MAX)).unwrap_or(u32::MAX)
}

fn convert(node: &KfdNode) -> Option<Node> {
    let gpu_id = low32(node.gpu_id?);
    // In listing order: CRIU reads io_links/ as readdir returns it
    // (checkpoint-restore/criu:plugins/amdgpu/amdgpu_plugin_topology.c:628),
    // which decides the order of hive members (:882-887).
    let links = node
        .io_links_listed()
        .filter_map(|l| {
            let kind = match l.link_type {
                LinkType::Pcie => LinkKind::Pcie,
                LinkType::Xgmi => LinkKind::Xgmi,
                LinkType::Other(_) => return None,
            };
            Some(Link {
                kind,
                to: l.node_to,
            })
        })
        .collect();
    let (props, location) = if gpu_id == 0 {
        (GpuProps::default(), Location::default())
    } else {
        let r = RestoreProps::from_node(node);
        let p = &node.properties;
        let bdf = p
            .get("location_id")
            .and_then(|loc| PciAddress::from_kfd(p.get_or_zero("domain"), loc))
            .map(|a| a.to_string());
        let render_minor = p
            .get("drm_render_minor")
            .and_then(|m| u32::try_from(m).ok());
        (props_of(&r), Location { bdf, render_minor })
    };
    Some(Node {
        id: node.index,
        gpu_id,
        props,
        links,
        location,
    })
}

fn props_of(r: &RestoreProps) -> GpuProps {
    GpuProps {
        simd_count: low32(r.simd_count),
        mem_banks_count: low32(r.mem_banks_count),
        caches_count: low32(r.caches_count),
        io_links_count: low32(r.io_links_count),
        max_waves_per_simd: low32(r.max_waves_per_simd),
        lds_size_in_kb: low32(r.lds_size_in_kb),
        num_gws: low32(r.num_gws),
        wave_front_size: low32(r.wave_front_size),
        array_count: low32(r.array_count),
        simd_arrays_per_engine: low32(r.simd_arrays_per_engine),
        cu_per_simd_array: low32(r.cu_per_simd_array),
        simd_per_cu: low32(r.simd_per_cu),
        max_slots_scratch_cu: low32(r.max_slots_scratch_cu),
        vendor_id: low32(r.vendor_id),
        device_id: low32(r.device_id),
        num_sdma_engines: low32(r.num_sdma_engines),
        num_sdma_xgmi_engines: low32(r.num_sdma_xgmi_engines),
        num_sdma_queues_per_engine: low32(r.num_sdma_queues_per_engine),
        num_cp_queues: low32(r.num_cp_queues),
        fw_version: low32(r.fw_version),
        capability: low32(r.capability),
        sdma_fw_version: low32(r.sdma_fw_version),
        vram_public: u32::from(r.vram_public),
        vram_size: r.vram_size,
        domain: low32(r.domain),
        drm_render_minor: low32(r.drm_render_minor),
        hive_id: r.hive_id,
    }
}

/// Parses a `gpu_id` written in decimal or `0x` hex.
fn parse_gpu_id(id: &str) -> Option<u32> {
    match id.strip_prefix("0x").or_else(|| id.strip_prefix("0X")) {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => id.parse().ok(),
    }
}

/// The GPU nodes `id` names: a `gpu_id`, `renderD<minor>`, the PCI address
/// of a partition (function ≠ 0), or that of a GPU (function 0: all its
/// partitions; name partition 0 alone by its gpu_id or render node).
fn resolve(topo: &Topo, id: &str) -> BTreeSet<u32> {
    let gpus = || topo.nodes.iter().filter(|n| n.is_gpu());
    if let Some(minor) = id
        .strip_prefix("renderD")
        .and_then(|m| m.parse::<u32>().ok())
    {
        return gpus()
            .filter(|n| n.location.render_minor == Some(minor))
            .map(|n| n.id)
            .collect();
    }
    if let Ok(address) = id.parse::<PciAddress>() {
        return gpus()
            .filter(|n| {
                let Some(own) = n
                    .location
                    .bdf
                    .as_deref()
                    .and_then(|b| b.parse::<PciAddress>().ok())
                else {
                    return false;
                };
                own == address || (address.function == 0 && own.with_function(0) == address)
            })
            .map(|n| n.id)
            .collect();
    }
    match parse_gpu_id(id) {
        Some(gpu_id) => gpus()
            .filter(|n| n.gpu_id == gpu_id)
            .map(|n| n.id)
            .collect(),
        None => BTreeSet::new(),
    }
}

impl LocalTopology {
    /// What a task allowed only the GPUs `ids` would see; every GPU when
    /// `ids` is empty.
    ///
    /// # Errors
    /// [`LocalError::UnknownGpu`] for an id that names no GPU node.
    pub fn visible(&self, ids: &[String]) -> Result<Topo, LocalError> {
        if ids.is_empty() {
            return Ok(self.topo.clone());
        }
        let mut keep = BTreeSet::new();
        for id in ids {
            let found = resolve(&self.topo, id.trim());
            if found.is_empty() {
                return Err(LocalError::UnknownGpu { id: id.clone() });
            }
            keep.extend(found);
        }
        let nodes = self
            .topo
            .nodes
            .iter()
            .filter(|n| !n.is_gpu() || keep.contains(&n.id))
            .cloned()
            .collect();
        Ok(Topo { nodes })
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::topology::{IoLink, Properties};

    fn link(index: u32, link_type: LinkType, node_to: u32) -> IoLink {
        IoLink {
            index,
            link_type,
            node_from: 1,
            node_to,
            weight: 0,
            min_bandwidth: 0,
            max_bandwidth: 0,
            flags: 0,
        }
    }

    #[test]
    fn links_keep_the_listing_order_not_the_index_order() {
        // io_links/ listed as 2, 0, 1 (kernfs lists by name hash); the
        // inventory keeps them sorted, CRIU reads them as listed.
        let node = KfdNode {
            index: 1,
            path: PathBuf::from("nodes/1"),
            gpu_id: Some(0x1234),
            name: None,
            properties: Properties::default(),
            mem_banks: Vec::new(),
            io_links: vec![
                link(0, LinkType::Pcie, 0),
                link(1, LinkType::Xgmi, 3),
                link(2, LinkType::Xgmi, 2),
            ],
            io_links_order: vec![2, 0, 1],
            p2p_links: Vec::new(),
        };
        let to: Vec<u32> = convert(&node).unwrap().links.iter().map(|l| l.to).collect();
        assert_eq!(to, [2, 0, 3]);
        let sorted: Vec<u32> = node.io_links.iter().map(|l| l.index).collect();
        assert_eq!(sorted, [0, 1, 2], "other callers still see index order");
    }
}
