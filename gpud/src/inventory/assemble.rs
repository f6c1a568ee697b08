//! From KFD GPU nodes to physical GPUs with partitions.
//!
//! Partitions of one GPU share `domain`, bus, device and `unique_id`; the
//! function bits of `location_id` carry the partition index. Two groups that
//! claim the same PCI address cannot both be real: the later one is skipped
//! and reported.

use std::collections::BTreeMap;

use super::{Gpu, Partition, restore::RestoreProps};
use crate::{
    drm::{self, PciDeviceInfo, RenderParent},
    gfx::GfxTarget,
    hostpaths::HostPaths,
    pci::PciAddress,
    topology::{KfdNode, Topology},
};

/// Most XCCs a KFD node may report (an MI300X has 8 per GPU).
const MAX_XCC: u64 = 64;
/// Most compute units a KFD node may report (an MI300X has 304 per GPU).
const MAX_CUS: u64 = 4096;
/// Most VRAM a KFD node may report: 1 PiB. With these bounds no sum over a
/// GPU's partitions (at most 8: the PCI function bits) can overflow.
const MAX_VRAM: u64 = 1 << 50;

/// A GPU node that could be described.
struct GpuNode<'a> {
    node: &'a KfdNode,
    address: PciAddress,
    unique_id: u64,
    compute_units: u32,
    num_xcc: u32,
    vram_bytes: u64,
}

/// Builds the physical GPUs of `topology`, ordered by PCI address.
pub(super) fn gpus(topology: &Topology, paths: &HostPaths, warnings: &mut Vec<String>) -> Vec<Gpu> {
    let mut groups: BTreeMap<(PciAddress, u64), Vec<GpuNode<'_>>> = BTreeMap::new();
    for node in topology.nodes.iter().filter(|n| n.is_gpu()) {
        match describe(node) {
            Ok(gpu_node) => {
                let key = (gpu_node.address.with_function(0), gpu_node.unique_id);
                groups.entry(key).or_default().push(gpu_node);
            }
            Err(reason) => warnings.push(format!("KFD node {} skipped: {reason}", node.index)),
        }
    }
    let missing_gpu_id = topology.nodes.iter().filter(|n| n.gpu_id.is_none()).count();
    if missing_gpu_id > 0 {
        warnings.push(format!(
            "{missing_gpu_id} KFD nodes have no gpu_id file under {}; CPU and GPU nodes told apart by simd_count",
            topology.path.display()
        ));
    }
    let mut gpus: Vec<Gpu> = Vec::with_capacity(groups.len());
    let mut claimed: BTreeMap<PciAddress, u32> = BTreeMap::new();
    let mut ordered: Vec<Vec<GpuNode<'_>>> = groups.into_values().collect();
    ordered.sort_by_key(|g| g.first().map(|n| n.node.index));
    for group in ordered {
        let (first, partitioned) = (&group[0], group.len() > 1);
        let bdf = if partitioned {
            first.address.with_function(0)
        } else {
            first.address
        };
        if let Some(owner) = claimed.get(&bdf) {
            let nodes: Vec<String> = group.iter().map(|n| n.node.index.to_string()).collect();
            warnings.push(format!(
                "KFD node(s) {} skipped: they claim PCI address {bdf} already described by KFD node \
                 {owner} but report another unique_id ({})",
                nodes.join(","),
                first.unique_id
            ));
            continue;
        }
        claimed.insert(bdf, first.node.index);
        gpus.push(build_gpu(group, topology, paths, warnings));
    }
    gpus.sort_by_key(|g| g.bdf);
    warn_missing_partitions(&gpus, warnings);
    gpus
}

/// GPUs of one model in one partition mode have the same number of
/// partitions; fewer means KFD left some out (a node with more partitions
/// than DRM render minors, 64, loses the last ones).
fn warn_missing_partitions(gpus: &[Gpu], warnings: &mut Vec<String>) {
    let shapes: Vec<Shape<'_>> = gpus
        .iter()
        .map(|g| {
            let mode = g.compute_partition.as_deref();
            let xccs = g.total_xccs();
            let most = mode.map_or(0, |m| {
                crate::partition::expected_partitions(&m.to_ascii_uppercase(), xccs)
            });
            let most = usize::try_from(most).unwrap_or(usize::MAX);
            (g.device_id, mode, g.partitions.len(), most)
        })
        .collect();
    for (i, expected) in short_of_siblings(&shapes) {
        let gpu = &gpus[i];
        warnings.push(format!(
            "GPU {}: KFD shows {} partitions where other GPUs of the same model in {} show {expected}; \
             the kernel may have run out of DRM render minors",
            gpu.bdf,
            gpu.partitions.len(),
            gpu.compute_partition.as_deref().unwrap_or("?"),
        ));
    }
}

/// A GPU as [`short_of_siblings`] compares it: device id, compute partition
/// mode, partitions shown, and the most partitions its mode makes.
type Shape<'a> = (u64, Option<&'a str>, usize, usize);

/// (index, expected count) of each GPU with fewer partitions than the most
/// its siblings (same model, same mode) show. A sibling showing more than
/// its mode makes is in the middle of a switch (the mode is written before
/// the driver re-creates the nodes) and sets no expectation.
fn short_of_siblings(gpus: &[Shape<'_>]) -> Vec<(usize, usize)> {
    let mut short = Vec::new();
    for (i, &(model, mode, count, _)) in gpus.iter().enumerate() {
        let Some(mode) = mode else { continue };
        let expected = gpus
            .iter()
            .filter(|&&(m, o, n, most)| m == model && o == Some(mode) && n <= most)
            .map(|&(_, _, n, _)| n)
            .max()
            .unwrap_or(0);
        if count < expected {
            short.push((i, expected));
        }
    }
    short
}

fn describe(node: &KfdNode) -> Result<GpuNode<'_>, String> {
    let p = &node.properties;
    let location = p
        .get("location_id")
        .ok_or("its properties have no location_id")?;
    let address = PciAddress::from_kfd(p.get_or_zero("domain"), location).ok_or_else(|| {
        format!(
            "domain/location_id {}/{location} is not a PCI address",
            p.get_or_zero("domain")
        )
    })?;
    let file = node.path.join("properties");
    let file = file.display();
    let simd_count = p.get_or_zero("simd_count");
    let simd_per_cu = p.get_or_zero("simd_per_cu");
    if simd_per_cu == 0 {
        return Err(format!(
            "simd_per_cu is missing or 0 (simd_count {simd_count}) in {file}"
        ));
    }
    if simd_count == 0 {
        return Err(format!(
            "{file}: simd_count 0 (a GPU without compute units)"
        ));
    }
    let compute_units = simd_count / simd_per_cu;
    let compute_units = u32::try_from(compute_units)
        .ok()
        .filter(|cus| u64::from(*cus) <= MAX_CUS)
        .ok_or_else(|| format!("{file}: simd_count {simd_count} is out of range"))?;
    let num_xcc = p.get("num_xcc").unwrap_or(1);
    let num_xcc = u32::try_from(num_xcc)
        .ok()
        .filter(|n| (1..=MAX_XCC).contains(&u64::from(*n)))
        .ok_or_else(|| format!("{file}: num_xcc {num_xcc} is out of range 1..={MAX_XCC}"))?;
    let banks = node
        .mem_banks
        .iter()
        .filter(|b| b.is_vram())
        .try_fold(0_u64, |sum, b| sum.checked_add(b.size_in_bytes));
    // Old kernels have no frame-buffer bank but fill local_mem_size; modern ones print 0 there.
    let vram_bytes = match banks {
        Some(0) => p.get_or_zero("local_mem_size"),
        Some(bytes) => bytes,
        None => u64::MAX,
    };
    if vram_bytes > MAX_VRAM {
        return Err(format!(
            "its VRAM ({}/mem_banks, local_mem_size) is out of range: {vram_bytes} bytes or more",
            node.path.display()
        ));
    }
    Ok(GpuNode {
        node,
        address,
        unique_id: p.get_or_zero("unique_id"),
        compute_units,
        num_xcc,
        vram_bytes,
    })
}

fn build_gpu(
    mut group: Vec<GpuNode<'_>>,
    topology: &Topology,
    paths: &HostPaths,
    warnings: &mut Vec<String>,
) -> Gpu {
    let partitioned = group.len() > 1;
    group.sort_by_key(|n| (n.address.function, n.node.index));
    let first = &group[0];
    let bdf = if partitioned {
        first.address.with_function(0)
    } else {
        first.address
    };
    let pci = drm::read_pci_device(paths, bdf).unwrap_or_default();
    let p = &first.node.properties;
    let gfx = GfxTarget::from_kfd(p.get_or_zero("gfx_target_version")).or_else(|| {
        let fallback = GfxTarget::from_pci_device_id(p.get_or_zero("device_id"));
        warnings.push(format!(
            "GPU {bdf}: KFD node {} has no gfx_target_version; gfx {} from PCI device id {:#06x}",
            first.node.index,
            fallback.map_or_else(|| "unknown".to_owned(), |g| g.to_string()),
            p.get_or_zero("device_id")
        ));
        fallback
    });
    let partitions = partitions(&group, partitioned, bdf, paths, warnings);
    // Bounded per node (MAX_VRAM, MAX_CUS), so these sums cannot overflow.
    let kfd_vram: u64 = group.iter().map(|n| n.vram_bytes).sum();
    let unique_id = first.unique_id;
    let device_id = Some(p.get_or_zero("device_id"))
        .filter(|d| *d != 0)
        .or_else(|| pci.device.map(u64::from))
        .unwrap_or(0);
    let gpu = Gpu {
        bdf,
        rocr_uuid: (unique_id != 0).then(|| format!("GPU-{unique_id:016x}")),
        unique_id,
        gfx,
        compute_units: partitions.iter().map(|p| p.compute_units).sum(),
        cus_per_wgp: gfx.map_or(1, GfxTarget::cus_per_wgp),
        vram_bytes: pci.vram_total.unwrap_or(kfd_vram),
        numa_node: pci
            .numa_node
            .or_else(|| linked_cpu_node(first.node, topology)),
        market_name: None,
        amdsmi_uuid: None,
        derived_uuid: derived_uuid(&pci, unique_id, device_id),
        published_id: None,
        compute_partition: pci
            .compute_partition
            .clone()
            .or_else(|| inferred_mode(&group)),
        memory_partition: pci.memory_partition.clone(),
        available_compute_partitions: pci.available_compute_partitions.clone(),
        supported_compute_partitions: pci.supported_compute_partitions.clone(),
        available_memory_partitions: pci.available_memory_partitions.clone(),
        vendor_id: p.get_or_zero("vendor_id"),
        device_id,
        revision: pci.revision,
        hive_id: p.get_or_zero("hive_id"),
        partition_profile: None,
        partition_profiles: Vec::new(),
        partitions,
        links: Vec::new(),
    };
    if let Some(vendor) = pci.vendor.filter(|v| *v != 0x1002) {
        warnings.push(format!(
            "GPU {bdf}: PCI vendor is {vendor:#06x}, not AMD (0x1002)"
        ));
    }
    gpu
}

/// AMD SMI's UUID of the GPU (`super::smi_uuid`): the serial from the PCI
/// `unique_id` file as AMD SMI reads it, else KFD's (the same number).
fn derived_uuid(pci: &PciDeviceInfo, kfd_unique_id: u64, device_id: u64) -> Option<String> {
    let device_id = u16::try_from(pci.device.map_or(device_id, u64::from))
        .ok()
        .filter(|d| *d != 0)?;
    let serial = pci.unique_id.unwrap_or(kfd_unique_id);
    Some(super::smi_uuid::published(serial, device_id))
}

fn partitions(
    group: &[GpuNode<'_>],
    partitioned: bool,
    bdf: PciAddress,
    paths: &HostPaths,
    warnings: &mut Vec<String>,
) -> Vec<Partition> {
    let mut out: Vec<Partition> = Vec::with_capacity(group.len());
    for n in group {
        let index = if partitioned {
            u32::from(n.address.function)
        } else {
            0
        };
        if let Some(other) = out.iter().find(|p| p.index == index) {
            warnings.push(format!(
                "KFD node {} skipped: partition {index} of GPU {bdf} is already KFD node {}",
                n.node.index, other.kfd_node
            ));
            continue;
        }
        let render_minor = n
            .node
            .properties
            .get("drm_render_minor")
            .and_then(|m| u32::try_from(m).ok());
        let render = render_minor.and_then(|m| drm::read_render_node(paths, m));
        out.push(Partition {
            index,
            kfd_node: n.node.index,
            gpu_id: n.node.gpu_id,
            render_minor,
            card_minor: render.as_ref().and_then(|r| r.card_minor),
            bdf: n.address,
            compute_units: n.compute_units,
            num_xcc: n.num_xcc,
            vram_bytes: n.vram_bytes,
            xcp: render.and_then(|r| match r.parent {
                RenderParent::Xcp(k) => Some(k),
                _ => None,
            }),
            restore: RestoreProps::from_node(n.node),
        });
    }
    out
}

/// When KFD gave no per-partition VRAM, share the whole GPU's equally.
pub(super) fn fill_partition_vram(gpu: &mut Gpu) {
    let count = u64::try_from(gpu.partitions.len()).unwrap_or(1).max(1);
    for part in &mut gpu.partitions {
        if part.vram_bytes == 0 {
            part.vram_bytes = gpu.vram_bytes / count;
        }
    }
}

/// The partition mode KFD implies when sysfs and AMD SMI say nothing: one node
/// per XCC is CPX; otherwise the node count names the mode.
fn inferred_mode(group: &[GpuNode<'_>]) -> Option<String> {
    let xcc = group[0].node.properties.get("num_xcc").unwrap_or(1);
    let mode = match group.len() {
        0 | 1 => return None,
        _ if xcc == 1 => "CPX",
        2 => "DPX",
        3 => "TPX",
        4 => "QPX",
        _ => "CPX",
    };
    Some(mode.to_owned())
}

/// NUMA node from KFD: an APU node is its own; a dGPU's is the CPU node its
/// first link to a CPU node points to.
pub(super) fn linked_cpu_node(node: &KfdNode, topology: &Topology) -> Option<u32> {
    if node.has_cpu_cores() {
        return Some(node.index);
    }
    node.io_links.iter().find_map(|link| {
        let peer = topology.node(link.node_to)?;
        (!peer.is_gpu() || peer.has_cpu_cores()).then_some(peer.index)
    })
}

#[cfg(test)]
mod partition_count_tests {
    use super::{Shape, short_of_siblings};

    #[test]
    fn a_gpu_short_of_its_cpx_siblings_is_named() {
        let gpus: [Shape<'_>; 3] = [
            (0x74a1, Some("CPX"), 8, 8),
            (0x74a1, Some("CPX"), 7, 7),
            (0x74b5, Some("CPX"), 4, 4),
        ];
        assert_eq!(short_of_siblings(&gpus), [(1, 8)]);
    }

    #[test]
    fn a_gpu_in_the_middle_of_a_switch_sets_no_expectation() {
        // GPU 0's mode already reads SPX, its eight CPX nodes are not gone yet.
        let gpus: [Shape<'_>; 3] = [
            (0x74a1, Some("SPX"), 8, 1),
            (0x74a1, Some("SPX"), 1, 1),
            (0x74a1, Some("SPX"), 1, 1),
        ];
        assert!(short_of_siblings(&gpus).is_empty());
        let unpartitioned: [Shape<'_>; 2] = [(0x7551, None, 1, 0), (0x7551, None, 0, 0)];
        assert!(short_of_siblings(&unpartitioned).is_empty());
    }
}
