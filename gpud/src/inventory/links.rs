//! Links between the physical GPUs of a node, from KFD `io_links` (direct
//! links: XGMI, or PCIe where the kernel lists one) and `p2p_links` (PCIe peer
//! paths through the host). Pairs KFD says nothing about are reported as a
//! path through the host, with the hop count the CPU topology implies.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Gpu, assemble::linked_cpu_node};
use crate::{
    pci::PciAddress,
    topology::{IoLink, LinkType, Topology},
};

/// KFD's weight for a link between two partitions of one socket.
const INTRA_SOCKET_WEIGHT: u64 = 13;
/// KFD's weight per XGMI hop.
const XGMI_HOP_WEIGHT: u64 = 15;

/// How a link was learnt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkVia {
    /// A direct KFD `io_links` entry.
    IoLink,
    /// A KFD `p2p_links` entry (PCIe peer-to-peer through the host).
    P2pLink,
    /// No KFD entry: the two GPUs reach each other through their CPU nodes.
    Host,
}

/// The best link from one GPU to another.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuLink {
    pub peer: PciAddress,
    pub link_type: LinkType,
    pub via: LinkVia,
    /// KFD weight; `None` for links through the host that KFD does not list.
    pub weight: Option<u64>,
    pub hops: Option<u32>,
}

/// Fills `links` of every GPU.
pub(super) fn attach(gpus: &mut [Gpu], topology: &Topology) {
    let owner: BTreeMap<u32, usize> = gpus
        .iter()
        .enumerate()
        .flat_map(|(i, g)| g.partitions.iter().map(move |p| (p.kfd_node, i)))
        .collect();
    let cpu_of: Vec<Option<u32>> = gpus
        .iter()
        .map(|g| {
            let first = g.partitions.first()?;
            linked_cpu_node(topology.node(first.kfd_node)?, topology)
        })
        .collect();
    let mut all = Vec::with_capacity(gpus.len());
    for (i, gpu) in gpus.iter().enumerate() {
        let mut best: BTreeMap<usize, GpuLink> = BTreeMap::new();
        let partitioned = gpu.partitions.len() > 1;
        for part in &gpu.partitions {
            let Some(node) = topology.node(part.kfd_node) else {
                continue;
            };
            let candidates = node
                .io_links
                .iter()
                .map(|l| (l, LinkVia::IoLink))
                .chain(node.p2p_links.iter().map(|l| (l, LinkVia::P2pLink)));
            for (link, via) in candidates {
                let Some(&peer) = owner.get(&link.node_to).filter(|&&p| p != i) else {
                    continue;
                };
                let peer_partitioned = gpus[peer].partitions.len() > 1;
                let hops = hops(
                    link,
                    via,
                    partitioned || peer_partitioned,
                    cpu_of[i] == cpu_of[peer],
                );
                let candidate = GpuLink {
                    peer: gpus[peer].bdf,
                    link_type: link.link_type,
                    via,
                    weight: Some(link.weight),
                    hops,
                };
                best.entry(peer)
                    .and_modify(|cur| {
                        if (candidate.via, candidate.weight) < (cur.via, cur.weight) {
                            *cur = candidate.clone();
                        }
                    })
                    .or_insert(candidate);
            }
        }
        for (peer, other) in gpus.iter().enumerate() {
            if peer != i && !best.contains_key(&peer) {
                let same_cpu = cpu_of[i].is_some() && cpu_of[i] == cpu_of[peer];
                best.insert(
                    peer,
                    GpuLink {
                        peer: other.bdf,
                        link_type: LinkType::Pcie,
                        via: LinkVia::Host,
                        weight: None,
                        hops: Some(if same_cpu { 2 } else { 3 }),
                    },
                );
            }
        }
        all.push(best.into_values().collect::<Vec<_>>());
    }
    for (gpu, links) in gpus.iter_mut().zip(all) {
        gpu.links = links;
    }
}

/// Hop count of a KFD link: XGMI weight is 15 per hop, plus 13 for each end
/// that is a partition; PCIe peer paths go GPU-CPU(-CPU)-GPU.
fn hops(link: &IoLink, via: LinkVia, partitioned: bool, same_cpu: bool) -> Option<u32> {
    match (link.link_type, via) {
        (LinkType::Xgmi, _) => {
            let socket_legs = if partitioned {
                2 * INTRA_SOCKET_WEIGHT
            } else {
                0
            };
            let xgmi = link.weight.checked_sub(socket_legs)?;
            (xgmi > 0 && xgmi % XGMI_HOP_WEIGHT == 0)
                .then(|| u32::try_from(xgmi / XGMI_HOP_WEIGHT).ok())
                .flatten()
        }
        (_, LinkVia::P2pLink) => Some(if same_cpu { 2 } else { 3 }),
        _ => Some(1),
    }
}
