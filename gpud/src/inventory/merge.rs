//! Folding an AMD SMI report into the sysfs inventory.
//!
//! Sysfs stays the source of scheduling facts (CUs, gfx, partition nodes);
//! AMD SMI adds what sysfs lacks (its UUID, partition profiles, the market
//! name when `amdgpu.ids` has none)
//! and fills gaps (VRAM, partition mode) where sysfs is silent. Processors are
//! joined to partitions by KFD `gpu_id`, else by KFD node index, else by
//! PCI address and partition index.

use super::{Gpu, Partition, smi_uuid};
use crate::amdsmi::report::{AmdSmiReport, ProcessorInfo};

/// Applies `report` to `gpus`, noting disagreements in `warnings`.
pub(super) fn apply(gpus: &mut [Gpu], report: &AmdSmiReport, warnings: &mut Vec<String>) {
    for gpu in gpus.iter_mut() {
        let joined: Vec<(u32, &ProcessorInfo)> = gpu
            .partitions
            .iter()
            .filter_map(|part| find(report, gpu, part).map(|proc| (part.index, proc)))
            .collect();
        if joined.is_empty() {
            warnings.push(format!(
                "GPU {}: AMD SMI reports no processor for it",
                gpu.bdf
            ));
            continue;
        }
        for (index, proc) in &joined {
            if let Some(id) = proc.partition_id.filter(|id| id != index) {
                warnings.push(format!(
                    "GPU {} partition {index}: AMD SMI calls it partition {id}; keeping the KFD index",
                    gpu.bdf
                ));
            }
        }
        let primary = joined
            .iter()
            .find(|(index, _)| *index == 0)
            .map_or(joined[0].1, |(_, p)| *p);
        apply_primary(gpu, primary);
        check_uuid(gpu, &report.layout, warnings);
    }
}

fn apply_primary(gpu: &mut Gpu, proc: &ProcessorInfo) {
    // libdrm's amdgpu.ids named it already, as AMD SMI 6.3+ does.
    if gpu.market_name.is_none() {
        gpu.market_name = proc.market_name.clone().filter(|n| !n.is_empty());
    }
    gpu.amdsmi_uuid = proc.uuid.clone().filter(|u| !u.is_empty());
    // Without the sysfs partition files the mode was at best inferred from KFD.
    let from_sysfs = !gpu.available_compute_partitions.is_empty();
    if !from_sysfs && let Some(mode) = &proc.compute_partition {
        gpu.compute_partition = Some(mode.to_ascii_uppercase());
    }
    if gpu.memory_partition.is_none() {
        gpu.memory_partition = proc
            .memory_partition
            .clone()
            .map(|m| m.to_ascii_uppercase());
    }
    // Partition 0 reports the whole device, from the same counter as
    // `mem_info_vram_total`: exact where the KFD banks are rounded shares.
    if let Some(vram) = proc.vram_total_bytes.filter(|v| *v > 0) {
        gpu.vram_bytes = vram;
    }
    gpu.partition_profile = proc.partition_profile.clone();
    if let Some(config) = &proc.profile_config {
        gpu.partition_profiles = config.profiles.clone();
    }
}

/// A library whose UUID is not the one its release derives from sysfs
/// (`super::smi_uuid`) is named: the published ID would then differ from
/// what that library's users see.
fn check_uuid(gpu: &Gpu, layout: &str, warnings: &mut Vec<String>) {
    let (Some(reported), Some(published)) = (&gpu.amdsmi_uuid, &gpu.derived_uuid) else {
        return;
    };
    let Ok(device_id) = u16::try_from(gpu.device_id) else {
        return;
    };
    let expected = smi_uuid::expected(layout, published, gpu.unique_id, device_id);
    if !reported.eq_ignore_ascii_case(&expected) {
        warnings.push(format!(
            "GPU {}: AMD SMI (layout {layout}) reports UUID {reported}, where sysfs gives \
             {expected} for that release; the GPU is published under {published} when first seen",
            gpu.bdf
        ));
    }
}

fn find<'r>(report: &'r AmdSmiReport, gpu: &Gpu, part: &Partition) -> Option<&'r ProcessorInfo> {
    let procs = &report.processors;
    if let Some(gpu_id) = part.gpu_id
        && let Some(p) = procs.iter().find(|p| p.kfd_id == Some(gpu_id))
    {
        return Some(p);
    }
    if let Some(p) = procs.iter().find(|p| p.kfd_node == Some(part.kfd_node)) {
        return Some(p);
    }
    let bdf = gpu.bdf.to_string();
    procs
        .iter()
        .filter(|p| p.bdf.as_deref() == Some(bdf.as_str()))
        .find(|p| p.partition_id.unwrap_or(0) == part.index)
}
