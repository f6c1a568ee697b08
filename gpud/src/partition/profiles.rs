//! Each GPU's menu of compute-partition profiles, for the scheduler: from
//! AMD SMI's accelerator profile config when the library lists it (6.4+,
//! root), else from sysfs: the modes in `available_compute_partition` (those
//! the current memory mode allows), each with the partitions and XCCs the
//! GPU's XCC count gives, and the current memory mode.

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
        .filter(|m| offered(m))
        .zip(0..)
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
