//! Each GPU's menu of compute-partition profiles, for the scheduler: from
//! AMD SMI's accelerator profile config when the library lists it (6.4+,
//! root), else from sysfs: the modes in `available_compute_partition` (those
//! the current memory mode allows), each with the partitions and XCCs the
//! GPU's XCC count gives, and the current memory mode.
//!
//! A profile's `index` is what `amdsmi_set_gpu_accelerator_partition_profile`
//! takes, on both paths. AMD SMI numbers its profiles by walking SPX, DPX,
//! TPX, QPX, CPX and keeping those named in the kernel's
//! `compute_partition_config/supported_xcp_configs` (every mode the GPU has),
//! or in `available_compute_partition` on kernels without that file
//! (ROCm/amdsmi:src/amd_smi/amd_smi.cc,
//! `amdsmi_get_gpu_accelerator_partition_profile_config`). The sysfs path
//! numbers the same way, so a mode the current memory mode does not allow
//! still holds its place: CPX is 3 on an MI300X in NPS4 too, where it is the
//! only mode offered.

pub use ipc::types::PartitionProfile;

use super::{MODES, expected_partitions};
use crate::inventory::Gpu;

/// The GPU's profiles; empty for a GPU without compute partitions.
pub fn profiles(gpu: &Gpu) -> Vec<PartitionProfile> {
    if !gpu.partition_profiles.is_empty() {
        return gpu
            .partition_profiles
            .iter()
            .map(|p| PartitionProfile {
                index: p.profile_index,
                compute_partition: p.profile_type.to_ascii_uppercase(),
                memory_partitions: p.memory_caps.clone(),
                partitions: p.num_partitions,
                xcc_per_partition: p.xcc_per_partition.unwrap_or(0),
            })
            .collect();
    }
    let xccs = gpu.total_xccs();
    let memory: Vec<String> = gpu.memory_partition.iter().cloned().collect();
    let offered = |mode: &str| {
        gpu.available_compute_partitions
            .iter()
            .any(|m| m.eq_ignore_ascii_case(mode))
    };
    MODES
        .into_iter()
        .filter_map(|mode| Some((mode, amdsmi_index(gpu, mode)?)))
        .filter(|(mode, _)| offered(mode))
        .map(|(mode, index)| {
            let partitions = expected_partitions(mode, xccs);
            PartitionProfile {
                index,
                compute_partition: mode.to_owned(),
                memory_partitions: memory.clone(),
                partitions,
                xcc_per_partition: xccs / partitions.max(1),
            }
        })
        .collect()
}

/// AMD SMI's `profile_index` of `mode` on `gpu`, from sysfs: the mode's
/// position among [`MODES`] named in `supported_xcp_configs`, else in
/// `available_compute_partition`; `None` when neither names it.
pub fn amdsmi_index(gpu: &Gpu, mode: &str) -> Option<u32> {
    let table = if gpu.supported_compute_partitions.is_empty() {
        &gpu.available_compute_partitions
    } else {
        &gpu.supported_compute_partitions
    };
    let named = |m: &str| table.iter().any(|t| t.eq_ignore_ascii_case(m));
    MODES
        .into_iter()
        .filter(|m| named(m))
        .zip(0..)
        .find(|(m, _)| m.eq_ignore_ascii_case(mode))
        .map(|(_, index)| index)
}
