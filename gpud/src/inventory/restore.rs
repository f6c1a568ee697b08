//! The per-node properties CRIU's amdgpu plugin compares when it restores a
//! checkpoint (see the restore-check design): the ones with an option
//! (`KFD_*_CHECK`), the ones always compared for equality, and the links.

use serde::Serialize;

use crate::topology::{KfdNode, LinkType};

/// Restore-relevant properties of one KFD GPU node, as the host sees them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RestoreProps {
    /// Compared `checkpoint <= restore` unless its option is off.
    pub fw_version: u64,
    pub sdma_fw_version: u64,
    pub caches_count: u64,
    pub num_gws: u64,
    /// `size_in_bytes` of the first frame-buffer bank (heap type 1 or 2).
    pub vram_size: u64,
    /// Compared for equality unless KFD_CAPABILITY_CHECK=0: all 32 bits.
    pub capability: u64,
    /// Always compared for equality.
    pub simd_count: u64,
    pub mem_banks_count: u64,
    pub io_links_count: u64,
    pub max_waves_per_simd: u64,
    pub lds_size_in_kb: u64,
    pub wave_front_size: u64,
    pub array_count: u64,
    pub simd_arrays_per_engine: u64,
    pub cu_per_simd_array: u64,
    pub simd_per_cu: u64,
    pub max_slots_scratch_cu: u64,
    pub vendor_id: u64,
    pub device_id: u64,
    pub num_sdma_engines: u64,
    pub num_sdma_xgmi_engines: u64,
    pub num_sdma_queues_per_engine: u64,
    pub num_cp_queues: u64,
    /// Heap type 1 (public) rather than 2 (private) for the VRAM bank.
    pub vram_public: bool,
    /// Published, not compared.
    pub domain: u64,
    pub drm_render_minor: u64,
    #[serde(serialize_with = "super::decimal_string")]
    pub hive_id: u64,
    /// The PCIe and XGMI io links CRIU reads (other types are ignored there).
    pub io_links: Vec<RestoreLink>,
}

/// An io link as CRIU keeps it: type and target node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RestoreLink {
    pub link_type: LinkType,
    pub node_to: u32,
}

impl RestoreProps {
    /// Collects the properties of `node`; absent keys read as 0, as CRIU's parser leaves them.
    pub fn from_node(node: &KfdNode) -> Self {
        let p = &node.properties;
        let g = |key: &str| p.get_or_zero(key);
        let bank = node.mem_banks.iter().find(|b| b.is_vram());
        Self {
            fw_version: g("fw_version"),
            sdma_fw_version: g("sdma_fw_version"),
            caches_count: g("caches_count"),
            num_gws: g("num_gws"),
            vram_size: bank.map_or(0, |b| b.size_in_bytes),
            capability: g("capability"),
            simd_count: g("simd_count"),
            mem_banks_count: g("mem_banks_count"),
            io_links_count: g("io_links_count"),
            max_waves_per_simd: g("max_waves_per_simd"),
            lds_size_in_kb: g("lds_size_in_kb"),
            wave_front_size: g("wave_front_size"),
            array_count: g("array_count"),
            simd_arrays_per_engine: g("simd_arrays_per_engine"),
            cu_per_simd_array: g("cu_per_simd_array"),
            simd_per_cu: g("simd_per_cu"),
            max_slots_scratch_cu: g("max_slots_scratch_cu"),
            vendor_id: g("vendor_id"),
            device_id: g("device_id"),
            num_sdma_engines: g("num_sdma_engines"),
            num_sdma_xgmi_engines: g("num_sdma_xgmi_engines"),
            num_sdma_queues_per_engine: g("num_sdma_queues_per_engine"),
            num_cp_queues: g("num_cp_queues"),
            vram_public: bank.is_some_and(|b| b.heap_type == 1),
            domain: g("domain"),
            drm_render_minor: g("drm_render_minor"),
            hive_id: g("hive_id"),
            io_links: node
                .io_links
                .iter()
                .filter(|l| matches!(l.link_type, LinkType::Pcie | LinkType::Xgmi))
                .map(|l| RestoreLink {
                    link_type: l.link_type,
                    node_to: l.node_to,
                })
                .collect(),
        }
    }
}
