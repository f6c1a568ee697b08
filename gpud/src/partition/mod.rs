//! Compute partitions (docs/amd-hardware.md §6, §7, §10.1,
//! §10.3): each GPU's menu
//! of profiles for the scheduler, and switching an idle GPU's compute
//! partition.
//!
//! After an idleness check of our own (no KFD process holds VRAM or queues
//! on any of the GPU's partitions, and the caller says no allocation exists),
//! the switch goes through AMD SMI's accelerator profile API
//! (`amdsmi_set_gpu_accelerator_partition_profile` with the mode's
//! `profile_index`, in a helper process) where the library is loaded and
//! lists the GPU's profiles, and through the sysfs file otherwise (no ABI
//! hazard, an unambiguous `EBUSY`); a library call that fails other than
//! busy falls back to sysfs. The memory partition (NPS) is node
//! configuration and is never written. Waiting for the new partitions is the
//! caller's (it owns the inventory): [`expected_partitions`] says how many.

mod busy;
mod profiles;

use std::{io, path::PathBuf};

pub use busy::kfd_users;
pub use profiles::profiles;

use crate::{
    HostPaths,
    amdsmi::{AmdSmiConfig, AmdSmiError, LibrarySource, STATUS_BUSY},
    inventory::Gpu,
};

pub use crate::drm::MODES;

/// Why a switch was refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("{mode:?} is not a compute partition mode (SPX, DPX, TPX, QPX, CPX)")]
    BadMode { mode: String },
    #[error("GPU {gpu} has no compute partitions")]
    NotPartitionable { gpu: String },
    #[error("GPU {gpu} does not offer {mode} in memory mode {memory} (it offers {offered})")]
    NotOffered {
        gpu: String,
        mode: String,
        memory: String,
        offered: String,
    },
    #[error("GPU {gpu} is in use: {why}")]
    Busy { gpu: String, why: String },
    #[error("writing {mode} to {path}: {source}")]
    Write {
        mode: String,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The canonical (uppercase) mode for `mode`.
///
/// # Errors
/// [`PartitionError::BadMode`].
pub fn parse_mode(mode: &str) -> Result<&'static str, PartitionError> {
    let upper = mode.trim().to_ascii_uppercase();
    MODES
        .into_iter()
        .find(|m| *m == upper)
        .ok_or_else(|| PartitionError::BadMode {
            mode: mode.to_owned(),
        })
}

/// Partitions a GPU with `xccs` XCCs shows in `mode`.
pub fn expected_partitions(mode: &str, xccs: u32) -> u32 {
    match mode {
        "DPX" => 2,
        "TPX" => 3,
        "QPX" => 4,
        "CPX" => xccs.max(1),
        _ => 1,
    }
}

/// What [`switch`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Switched {
    /// The GPU was already in the mode; nothing written.
    Already,
    /// The mode was written to `current_compute_partition`; the driver now
    /// re-creates the partitions.
    Written,
    /// AMD SMI selected the mode's profile
    /// (`amdsmi_set_gpu_accelerator_partition_profile`); the driver now
    /// re-creates the partitions.
    ByAmdSmi { profile_index: u32 },
}

/// Switches `gpu` to `mode` (canonical) unless it is busy: through AMD SMI
/// where the library is loaded and lists the GPU's profiles (`amdsmi`), else
/// (and when the library's call fails other than busy) through sysfs.
///
/// # Errors
/// Not offered, busy (our check, the caller's allocations, the kernel's
/// `EBUSY` or AMD SMI's `BUSY`), or the write failed.
pub fn switch(
    paths: &HostPaths,
    amdsmi: &AmdSmiConfig,
    gpu: &Gpu,
    mode: &str,
    allocations_exist: bool,
) -> Result<Switched, PartitionError> {
    let name = gpu.bdf.to_string();
    if gpu.available_compute_partitions.is_empty() {
        return Err(PartitionError::NotPartitionable { gpu: name });
    }
    if !gpu
        .available_compute_partitions
        .iter()
        .any(|m| m.eq_ignore_ascii_case(mode))
    {
        return Err(PartitionError::NotOffered {
            gpu: name,
            mode: mode.to_owned(),
            memory: gpu.memory_partition.clone().unwrap_or_default(),
            offered: gpu.available_compute_partitions.join(", "),
        });
    }
    if gpu
        .compute_partition
        .as_deref()
        .is_some_and(|m| m.eq_ignore_ascii_case(mode))
    {
        return Ok(Switched::Already);
    }
    if allocations_exist {
        return Err(PartitionError::Busy {
            gpu: name,
            why: "the caller has allocations on it".to_owned(),
        });
    }
    let gpu_ids: Vec<u64> = gpu.partitions.iter().filter_map(|p| p.gpu_id).collect();
    if let Some(user) = kfd_users(paths, &gpu_ids).into_iter().next() {
        return Err(PartitionError::Busy {
            gpu: name,
            why: user.to_string(),
        });
    }
    if let Some(switched) = switch_by_amdsmi(amdsmi, gpu, mode)? {
        return Ok(switched);
    }
    let path = paths.pci_device(&name).join("current_compute_partition");
    std::fs::write(&path, mode).map_err(|source| match source.raw_os_error() {
        Some(code) if code == rustix::io::Errno::BUSY.raw_os_error() => PartitionError::Busy {
            gpu: name.clone(),
            why: format!("the driver refused the switch ({source})"),
        },
        _ => PartitionError::Write {
            mode: mode.to_owned(),
            path: path.clone(),
            source,
        },
    })?;
    Ok(Switched::Written)
}

/// The switch through AMD SMI, when the library is in use and its profile
/// config (read at the last probe) lists `mode`: `Ok(None)` to use sysfs.
fn switch_by_amdsmi(
    amdsmi: &AmdSmiConfig,
    gpu: &Gpu,
    mode: &str,
) -> Result<Option<Switched>, PartitionError> {
    if amdsmi.library == LibrarySource::Disabled {
        return Ok(None);
    }
    let Some(profile) = gpu
        .partition_profiles
        .iter()
        .find(|p| p.profile_type.eq_ignore_ascii_case(mode))
    else {
        return Ok(None);
    };
    let name = gpu.bdf.to_string();
    let profile_index = profile.profile_index;
    match crate::amdsmi::set_accelerator_profile(amdsmi, &name, profile_index) {
        Ok(()) => Ok(Some(Switched::ByAmdSmi { profile_index })),
        Err(AmdSmiError::Status { status, .. }) if status == STATUS_BUSY => {
            Err(PartitionError::Busy {
                gpu: name,
                why: format!("AMD SMI answered BUSY to profile {profile_index} ({mode})"),
            })
        }
        Err(err) => {
            tracing::warn!(gpu = %name, mode, "switching through AMD SMI failed ({err}); writing sysfs");
            Ok(None)
        }
    }
}

#[cfg(test)]
mod tests;
