//! The node's device inventory: physical GPUs, their compute partitions, links
//! and the properties other parts of the system (HAMi, CRIU) compare.
//!
//! Built from the KFD topology (always), DRM/PCI sysfs (when present) and an
//! AMD SMI report (when the library could be probed). Transport-neutral: the
//! D-Bus service and `amd-gpud inspect` both render this same value.

mod assemble;
mod identity;
mod links;
mod merge;
pub mod product_names;
mod restore;
pub mod smi_uuid;

pub use identity::without_amdsmi;
pub use links::{GpuLink, LinkVia};
pub use restore::RestoreProps;
use serde::{Serialize, Serializer};

use crate::{
    amdsmi::{
        AmdSmiConfig, LibrarySource,
        report::{AmdSmiReport, PartitionProfile},
    },
    gfx::GfxTarget,
    hostpaths::HostPaths,
    pci::PciAddress,
    topology::{TopologyError, read_topology},
};

/// Everything `amd-gpud` knows about the node's GPUs.
#[derive(Debug, Clone, Serialize)]
pub struct Inventory {
    /// Physical GPUs, ordered by PCI address.
    pub gpus: Vec<Gpu>,
    /// KFD CPU nodes (NUMA nodes as KFD sees them).
    pub cpus: Vec<CpuNode>,
    /// KFD `generation_id` at the time of the read.
    pub generation_id: Option<u64>,
    /// What happened with AMD SMI.
    pub amdsmi: AmdSmiSummary,
    /// The libdrm `amdgpu.ids` the product names were looked up in (path,
    /// version, entries); `None` when there was none to read.
    pub product_names: Option<String>,
    /// Problems found while reading; each names the file or device.
    pub warnings: Vec<String>,
}

/// A KFD CPU node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuNode {
    pub kfd_node: u32,
    pub cpu_cores: u64,
}

/// Whether AMD SMI contributed to the inventory, and if not, why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct AmdSmiSummary {
    /// `disabled`, `unavailable` or `loaded`.
    pub state: String,
    /// Library path and version when loaded; the reason otherwise.
    pub detail: String,
}

/// A physical GPU and its compute partitions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Gpu {
    /// PCI address of the physical device.
    pub bdf: PciAddress,
    /// ROCr's `GPU-<16 hex digits of unique_id>`; `None` when `unique_id` is 0.
    pub rocr_uuid: Option<String>,
    #[serde(serialize_with = "decimal_string")]
    pub unique_id: u64,
    pub gfx: Option<GfxTarget>,
    /// Active CUs of the whole GPU (sum over its partitions).
    pub compute_units: u32,
    pub cus_per_wgp: u32,
    /// VRAM of the whole GPU, bytes (0 when nothing reports it).
    pub vram_bytes: u64,
    pub numa_node: Option<u32>,
    pub market_name: Option<String>,
    /// AMD SMI's `device_uuid` as the loaded library reported it.
    pub amdsmi_uuid: Option<String>,
    /// AMD SMI's `device_uuid` computed from sysfs as AMD SMI 6.2 to 7.12
    /// derives it (`smi_uuid`): the ID the GPU is published under when first
    /// seen, with or without the library. `None` without a PCI device id.
    pub derived_uuid: Option<String>,
    /// The ID the GPU is published under, chosen once and kept in the
    /// state directory across reads and restarts; `None` until the service
    /// stamps it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub published_id: Option<String>,
    /// Current compute partition mode (`SPX`, `DPX`, `QPX`, `CPX`, ...).
    pub compute_partition: Option<String>,
    pub memory_partition: Option<String>,
    pub available_compute_partitions: Vec<String>,
    /// Every mode the GPU has (`supported_xcp_configs`), whatever the memory
    /// mode; empty on kernels without it.
    pub supported_compute_partitions: Vec<String>,
    pub available_memory_partitions: Vec<String>,
    pub vendor_id: u64,
    pub device_id: u64,
    /// PCI revision (sysfs `revision`); `None` without the PCI directory.
    pub revision: Option<u8>,
    /// XGMI hive; 0 when not in a hive.
    #[serde(serialize_with = "decimal_string")]
    pub hive_id: u64,
    /// The current accelerator partition profile (AMD SMI 6.3+).
    pub partition_profile: Option<PartitionProfile>,
    /// Every profile the GPU offers (AMD SMI 6.4+, root).
    pub partition_profiles: Vec<PartitionProfile>,
    /// One entry per KFD node of the GPU; exactly one when unpartitioned.
    pub partitions: Vec<Partition>,
    /// Links to the other GPUs of the node.
    pub links: Vec<GpuLink>,
}

/// One compute partition (one KFD GPU node) of a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Partition {
    /// Partition index within the GPU (0 when unpartitioned).
    pub index: u32,
    pub kfd_node: u32,
    /// KFD `gpu_id`; `None` when the file is missing.
    pub gpu_id: Option<u64>,
    pub render_minor: Option<u32>,
    pub card_minor: Option<u32>,
    /// PCI address from KFD `location_id`, whose function bits carry the index.
    pub bdf: PciAddress,
    pub compute_units: u32,
    pub num_xcc: u32,
    pub vram_bytes: u64,
    /// XCP platform device serving the render node, when not the PCI function.
    pub xcp: Option<u32>,
    /// What CRIU's amdgpu plugin compares at restore.
    pub restore: RestoreProps,
}

fn decimal_string<S: Serializer>(value: &u64, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.collect_str(value)
}

/// Runs the AMD SMI probe `config` asks for and says how it went, in one log
/// line when the library is unavailable.
pub fn probe_amdsmi(config: &AmdSmiConfig) -> (Option<AmdSmiReport>, AmdSmiSummary) {
    if matches!(config.library, LibrarySource::Disabled) {
        return (
            None,
            AmdSmiSummary::new("disabled", "AMD SMI switched off".to_owned()),
        );
    }
    match crate::amdsmi::probe(config) {
        Ok(report) => {
            let v = &report.version;
            let detail = format!(
                "{} (version {}.{}.{}, layout {})",
                report.library, v.major, v.minor, v.release, report.layout
            );
            (Some(report), AmdSmiSummary::new("loaded", detail))
        }
        Err(err) => {
            tracing::warn!("AMD SMI unavailable, inventory from sysfs only: {err}");
            (None, AmdSmiSummary::new("unavailable", err.to_string()))
        }
    }
}

impl AmdSmiSummary {
    pub fn new(state: &str, detail: String) -> Self {
        Self {
            state: state.to_owned(),
            detail,
        }
    }
}

impl Gpu {
    /// The XCCs of all its partitions; `u32::MAX` rather than a wrapped sum
    /// (each partition's count is bounded when read, so it never comes to that).
    pub fn total_xccs(&self) -> u32 {
        self.partitions
            .iter()
            .try_fold(0_u32, |sum, p| sum.checked_add(p.num_xcc))
            .unwrap_or(u32::MAX)
    }
}

impl Inventory {
    /// Finds a GPU by PCI address.
    pub fn gpu(&self, bdf: PciAddress) -> Option<&Gpu> {
        self.gpus.iter().find(|g| g.bdf == bdf)
    }
}

/// Reads the node's inventory from the host under `paths`, enriched by `amdsmi`.
///
/// # Errors
/// Only when the KFD topology directory itself is missing or unstable.
#[tracing::instrument(skip_all)]
pub fn discover(
    paths: &HostPaths,
    amdsmi: Option<&AmdSmiReport>,
) -> Result<Inventory, TopologyError> {
    let topology = read_topology(paths)?;
    let mut warnings: Vec<String> = topology.issues.iter().map(ToString::to_string).collect();
    let mut gpus = assemble::gpus(&topology, paths, &mut warnings);
    let product_names = identity::name_gpus(&mut gpus, paths, &mut warnings);
    if let Some(report) = amdsmi {
        merge::apply(&mut gpus, report, &mut warnings);
    }
    gpus.iter_mut().for_each(assemble::fill_partition_vram);
    links::attach(&mut gpus, &topology);
    let cpus = topology
        .nodes
        .iter()
        .filter(|n| !n.is_gpu() || n.has_cpu_cores())
        .map(|n| CpuNode {
            kfd_node: n.index,
            cpu_cores: n.properties.get_or_zero("cpu_cores_count"),
        })
        .collect();
    Ok(Inventory {
        gpus,
        cpus,
        generation_id: topology.generation_id,
        amdsmi: AmdSmiSummary::default(),
        product_names,
        warnings,
    })
}

#[cfg(test)]
pub(crate) mod tests;
