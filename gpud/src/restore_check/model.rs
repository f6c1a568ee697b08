//! One side of a restore: the KFD nodes as CRIU's amdgpu plugin sees them,
//! either saved in a checkpoint image or read from this node's sysfs.
//!
//! Order is part of the model: CRIU walks image entries in file order, and
//! sysfs nodes and each node's links in directory-listing order; hive
//! members follow from the link order, and its search depends on all of it.

use std::collections::HashMap;

/// CRAT io-link type as CRIU keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// Type 2.
    Pcie,
    /// Type 11.
    Xgmi,
    /// Anything else (not written by CRIU's dump; kept as found in an image).
    Other(u32),
}

impl LinkKind {
    pub fn from_crat(value: u32) -> Self {
        match value {
            2 => Self::Pcie,
            11 => Self::Xgmi,
            other => Self::Other(other),
        }
    }

    #[cfg(test)]
    pub fn crat(self) -> u32 {
        match self {
            Self::Pcie => 2,
            Self::Xgmi => 11,
            Self::Other(t) => t,
        }
    }
}

/// An io link: its type and the node it points to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    pub kind: LinkKind,
    pub to: u32,
}

/// The values of a GPU node CRIU compares, at the width CRIU stores them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuProps {
    pub simd_count: u32,
    pub mem_banks_count: u32,
    pub caches_count: u32,
    pub io_links_count: u32,
    pub max_waves_per_simd: u32,
    pub lds_size_in_kb: u32,
    pub num_gws: u32,
    pub wave_front_size: u32,
    pub array_count: u32,
    pub simd_arrays_per_engine: u32,
    pub cu_per_simd_array: u32,
    pub simd_per_cu: u32,
    pub max_slots_scratch_cu: u32,
    pub vendor_id: u32,
    pub device_id: u32,
    pub num_sdma_engines: u32,
    pub num_sdma_xgmi_engines: u32,
    pub num_sdma_queues_per_engine: u32,
    pub num_cp_queues: u32,
    pub fw_version: u32,
    pub capability: u32,
    pub sdma_fw_version: u32,
    /// 1 when the VRAM bank is heap type 1 (public), 0 for type 2 (private).
    pub vram_public: u32,
    pub vram_size: u64,
    /// Not compared.
    pub domain: u32,
    pub drm_render_minor: u32,
    pub hive_id: u64,
}

/// Where a local GPU node is, for people reading a verdict.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Location {
    /// PCI address of the node (a partition's function carries its index).
    pub bdf: Option<String>,
    pub render_minor: Option<u32>,
}

/// A KFD node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Node index (`nodes/<id>` on the host that wrote it).
    pub id: u32,
    /// KFD `gpu_id`; 0 for a CPU node.
    pub gpu_id: u32,
    /// Compared values; all zero on CPU nodes.
    pub props: GpuProps,
    /// PCIe and XGMI links, in order.
    pub links: Vec<Link>,
    /// Set on local nodes.
    pub location: Location,
}

impl Node {
    pub fn is_gpu(&self) -> bool {
        self.gpu_id != 0
    }
}

/// All nodes of one side, in CRIU's walking order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Topo {
    pub nodes: Vec<Node>,
}

impl Topo {
    /// Number of GPU nodes.
    #[cfg(test)]
    pub fn gpu_count(&self) -> usize {
        self.nodes.iter().filter(|n| n.is_gpu()).count()
    }
}

/// A link with what CRIU derives from it: whether its target exists on this
/// side (a link to a node the reader cannot see is invalid), whether that
/// target is a GPU, and whether the target links back with the same type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SideLink {
    pub kind: LinkKind,
    /// Index of the target in [`Topo::nodes`]; `None` for an invalid link.
    pub target: Option<usize>,
    pub to_gpu: bool,
    pub bidirectional: bool,
}

/// A [`Topo`] with its links resolved, its GPUs listed and its XGMI hives.
#[derive(Debug)]
pub struct Side<'a> {
    pub topo: &'a Topo,
    /// Node indices of the GPUs, in walking order. A GPU's position here is
    /// its "slot", the index the matchers use.
    pub gpus: Vec<usize>,
    /// Per node, its links.
    pub links: Vec<Vec<SideLink>>,
    /// Per node, its number of valid links.
    pub valid_links: Vec<usize>,
    /// XGMI hives as lists of slots, in the order they are found.
    pub hives: Vec<Vec<usize>>,
    /// Per slot, the hive it belongs to.
    pub hive_of: Vec<Option<usize>>,
}

impl<'a> Side<'a> {
    pub fn new(topo: &'a Topo) -> Self {
        let by_id: HashMap<u32, usize> = topo
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.id, i))
            .collect();
        let target = |l: &Link| by_id.get(&l.to).copied();
        let links: Vec<Vec<SideLink>> = topo
            .nodes
            .iter()
            .enumerate()
            .map(|(i, node)| {
                node.links
                    .iter()
                    .map(|l| {
                        let t = target(l);
                        let back = t.is_some_and(|t| {
                            topo.nodes[t]
                                .links
                                .iter()
                                .any(|b| b.kind == l.kind && target(b) == Some(i))
                        });
                        SideLink {
                            kind: l.kind,
                            target: t,
                            to_gpu: t.is_some_and(|t| topo.nodes[t].is_gpu()),
                            bidirectional: back,
                        }
                    })
                    .collect()
            })
            .collect();
        let valid_links = links
            .iter()
            .map(|ls: &Vec<SideLink>| ls.iter().filter(|l| l.target.is_some()).count())
            .collect();
        let gpus: Vec<usize> = (0..topo.nodes.len())
            .filter(|&i| topo.nodes[i].is_gpu())
            .collect();
        let (hives, hive_of) = hives(&gpus, &links);
        Self {
            topo,
            gpus,
            links,
            valid_links,
            hives,
            hive_of,
        }
    }

    /// The node of slot `slot`.
    pub fn node(&self, slot: usize) -> &Node {
        &self.topo.nodes[self.gpus[slot]]
    }

    /// The valid links of slot `slot` to CPU nodes.
    pub fn cpu_links(&self, slot: usize) -> impl Iterator<Item = &SideLink> {
        self.links[self.gpus[slot]]
            .iter()
            .filter(|l| l.target.is_some() && !l.to_gpu)
    }

    /// All links of slot `slot` (valid or not).
    pub fn all_links(&self, slot: usize) -> &[SideLink] {
        &self.links[self.gpus[slot]]
    }

    /// Number of valid links of slot `slot`.
    pub fn valid_link_count(&self, slot: usize) -> usize {
        self.valid_links[self.gpus[slot]]
    }
}

/// XGMI hives as the exhaustive search sees them: for every bidirectional
/// XGMI link between two GPUs, in walking order, the hive of the source GPU
/// is found or started and the peer joins it; a peer already in another
/// hive stays there. CRIU's own groups, CPU nodes and broken lists
/// included, are `criu::groups`'.
fn hives(gpus: &[usize], links: &[Vec<SideLink>]) -> (Vec<Vec<usize>>, Vec<Option<usize>>) {
    let slot_of: HashMap<usize, usize> = gpus.iter().enumerate().map(|(s, &n)| (n, s)).collect();
    let mut hives: Vec<Vec<usize>> = Vec::new();
    let mut hive_of: Vec<Option<usize>> = vec![None; gpus.len()];
    for (slot, &node) in gpus.iter().enumerate() {
        for link in &links[node] {
            let Some(peer) = link.target.and_then(|t| slot_of.get(&t).copied()) else {
                continue;
            };
            if link.kind != LinkKind::Xgmi || !link.bidirectional || peer == slot {
                continue;
            }
            let hive = match hive_of[slot] {
                Some(h) => h,
                None => {
                    hives.push(vec![slot]);
                    hive_of[slot] = Some(hives.len() - 1);
                    hives.len() - 1
                }
            };
            if hive_of[peer].is_none() {
                hives[hive].push(peer);
                hive_of[peer] = Some(hive);
            }
        }
    }
    (hives, hive_of)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u32, gpu_id: u32, links: &[(LinkKind, u32)]) -> Node {
        Node {
            id,
            gpu_id,
            props: GpuProps::default(),
            links: links.iter().map(|&(kind, to)| Link { kind, to }).collect(),
            location: Location::default(),
        }
    }

    #[test]
    fn links_resolve_and_hives_form_from_bidirectional_xgmi() {
        use LinkKind::{Pcie, Xgmi};
        let topo = Topo {
            nodes: vec![
                node(0, 0, &[(Pcie, 1), (Pcie, 2), (Pcie, 3)]),
                node(1, 11, &[(Pcie, 0), (Xgmi, 2)]),
                node(2, 22, &[(Pcie, 0), (Xgmi, 1), (Xgmi, 9)]),
                // A one-way XGMI link does not make a hive.
                node(3, 33, &[(Xgmi, 1)]),
            ],
        };
        let side = Side::new(&topo);
        assert_eq!(side.gpus, [1, 2, 3]);
        assert_eq!(side.valid_links, [3, 2, 2, 1]);
        assert_eq!(side.hives, [vec![0, 1]]);
        assert_eq!(side.hive_of, [Some(0), Some(0), None]);
        let l = side.all_links(1);
        assert!(l[0].bidirectional && !l[0].to_gpu);
        assert_eq!(l[2].target, None, "node 9 is not there");
        assert!(!side.all_links(2)[0].bidirectional);
        assert_eq!(side.cpu_links(0).count(), 1);
        assert_eq!(side.cpu_links(2).count(), 0);
    }
}
