//! What `GetUsage` answers: the VRAM each container's processes hold per
//! KFD GPU, each pod's `dmem.current`, and each GPU's own use; and what
//! `GetComputeUsage` answers: the CUs each container's waves occupy.

use serde::{Deserialize, Serialize};
use zbus::zvariant::{OwnedValue, Type, Value};

/// The VRAM the processes of one container hold on one KFD GPU
/// (`(sstut)`), summed from `vram_<gpu_id>` of KFD's per-process files.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type, Value, OwnedValue)]
pub struct ContainerVram {
    /// The pod's UID, as kubelet names its cgroup (dashes, lowercase).
    pub pod_uid: String,
    /// The container's runtime ID (hex) from its cgroup's name; empty for
    /// processes in the pod's own cgroup or a name of another form.
    pub container_id: String,
    /// KFD `gpu_id` of the GPU or partition.
    pub gpu_id: u64,
    /// Processes summed.
    pub processes: u32,
    pub vram_bytes: u64,
}

/// The compute units the waves of one container's processes occupy on one
/// KFD GPU (`(sstuu)`), summed from KFD's per-process
/// `stats_<gpu_id>/cu_occupancy`: the kernel turns the process's waves in
/// flight into CUs, rounding up (torvalds/linux:
/// drivers/gpu/drm/amd/amdkfd/kfd_process.c, `kfd_get_cu_occupancy`). An
/// instant's count, not an average. Present only where the file read (a
/// kernel or GPU without it gives none).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type, Value, OwnedValue)]
pub struct ContainerCompute {
    /// The pod's UID, as in [`ContainerVram`].
    pub pod_uid: String,
    /// The container's runtime ID, as in [`ContainerVram`].
    pub container_id: String,
    /// KFD `gpu_id` of the GPU or partition.
    pub gpu_id: u64,
    /// Processes summed.
    pub processes: u32,
    /// CUs occupied, summed over the processes.
    pub cus: u32,
}

/// One pod's `dmem.current` for one GPU (`(sst)`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type, Value, OwnedValue)]
pub struct PodDmem {
    pub pod_uid: String,
    /// PCI address of the GPU (the dmem region's).
    pub bdf: String,
    pub current_bytes: u64,
}

/// One GPU's own use (`(sxxxxs)`); -1 where unknown.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Type, Value, OwnedValue)]
pub struct GpuUse {
    /// PCI address of the GPU.
    pub bdf: String,
    pub vram_used_bytes: i64,
    /// Graphics activity, percent.
    pub busy_percent: i64,
    /// Edge (or first) temperature, millidegrees Celsius.
    pub temperature_millicelsius: i64,
    /// Average socket power, microwatts.
    pub power_microwatts: i64,
    /// Where VRAM used and activity come from: `amdsmi` (both from AMD
    /// SMI), `amdsmi-vram` or `amdsmi-busy` (that one from AMD SMI, the
    /// other from sysfs), or `sysfs` (both). Temperature and power are
    /// always sysfs's.
    pub source: String,
}

/// The three lists of a `GetUsage` answer, and `GetComputeUsage`'s.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub containers: Vec<ContainerVram>,
    pub dmem: Vec<PodDmem>,
    pub gpus: Vec<GpuUse>,
    /// Empty from an amd-gpud without `GetComputeUsage`.
    pub compute: Vec<ContainerCompute>,
}
