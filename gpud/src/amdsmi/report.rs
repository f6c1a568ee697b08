//! What one AMD SMI probe found, in a transport-neutral, serialisable form.
//!
//! The probe runs in a child process (see `child.rs`), which prints one
//! [`ProbeOutcome`] as JSON on stdout: an [`AmdSmiReport`] or a [`ProbeFailure`].
//! The parent decodes it. Everything in here is plain data: no handles, no pointers.

use serde::{Deserialize, Serialize};

/// Everything the probe learnt from the library.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AmdSmiReport {
    /// Path (or soname) of the library that was loaded.
    pub library: String,
    /// Version reported by `amdsmi_get_lib_version`.
    pub version: LibVersion,
    /// Struct layout family chosen from the version, e.g. `"6.2"`, `"6.4"`, `"7.0"`, `"7.13"`.
    pub layout: String,
    /// One entry per processor handle of type AMD_GPU, in enumeration order.
    pub processors: Vec<ProcessorInfo>,
    /// Calls that failed without making the whole probe fail.
    pub errors: Vec<CallError>,
    /// What `amdsmi-probe --set-profile` did; absent for a plain probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile_switch: Option<ProfileSwitch>,
    /// What `amdsmi-probe --usage` read; absent for every other run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Vec<GpuUsage>>,
}

impl AmdSmiReport {
    /// A report of `library` with nothing read yet, for the probe modes
    /// that fill one field of their own (`--usage`, `--set-profile`).
    pub(crate) fn of_library(library: String, version: LibVersion, layout: &str) -> Self {
        Self {
            library,
            version,
            layout: layout.to_owned(),
            processors: Vec::new(),
            errors: Vec::new(),
            profile_switch: None,
            usage: None,
        }
    }
}

/// One GPU's use as AMD SMI reports it (`amdsmi-probe --usage`), read on
/// the GPU's partition-0 processor (the one that speaks for the whole
/// device). `None` where the library has no such getter, it failed, or its
/// value is out of range.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUsage {
    /// PCI address `dddd:bb:dd.f`.
    pub bdf: String,
    /// `amdsmi_get_gpu_activity`'s `gfx_activity`, percent (0..=100).
    pub gfx_activity_percent: Option<u32>,
    /// `amdsmi_get_gpu_vram_usage`'s `vram_used` (MiB), in bytes.
    pub vram_used_bytes: Option<u64>,
}

/// The outcome of `amdsmi_set_gpu_accelerator_partition_profile` in a
/// `--set-profile` run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileSwitch {
    /// The GPU asked for, `dddd:bb:dd.f`.
    pub bdf: String,
    pub profile_index: u32,
    /// The setter's status (0: SUCCESS); `None` when no processor of the
    /// library has that address, or the library lacks the setter.
    pub status: Option<u32>,
    /// Symbolic name of `status`, or why the setter was not called.
    pub status_name: String,
}

/// Library version, normalised across the 6.x and 7.x `amdsmi_version_t` layouts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LibVersion {
    /// 6.x only: the `year` word (24 or 25).
    pub year: Option<u32>,
    pub major: u32,
    pub minor: u32,
    pub release: u32,
    /// The library's build string, copied out.
    pub build: Option<String>,
}

/// One processor (a whole GPU, or one compute partition of it).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessorInfo {
    pub socket_index: u32,
    pub processor_index: u32,
    /// PCI address `dddd:bb:dd.f` from `amdsmi_get_gpu_device_bdf`.
    pub bdf: Option<String>,
    /// Partition index: `kfd_info.current_partition_id`, else bits 31:28 of `amdsmi_get_gpu_bdf_id`.
    pub partition_id: Option<u32>,
    /// KFD `gpu_id` of this processor (`kfd_info.kfd_id`).
    pub kfd_id: Option<u64>,
    /// KFD topology node index (`kfd_info.node_id`).
    pub kfd_node: Option<u32>,
    /// `amdsmi_get_gpu_device_uuid`: an opaque label, not the ROCr UUID.
    pub uuid: Option<String>,
    pub market_name: Option<String>,
    pub asic: Option<AsicInfo>,
    /// `amdsmi_get_gpu_memory_total(VRAM)` in bytes.
    pub vram_total_bytes: Option<u64>,
    /// Upper-case mode string, e.g. `"SPX"`, `"CPX"`.
    pub compute_partition: Option<String>,
    /// Upper-case mode string, e.g. `"NPS1"`.
    pub memory_partition: Option<String>,
    pub enumeration: Option<EnumerationInfo>,
    pub partition_profile: Option<PartitionProfile>,
    pub profile_config: Option<ProfileConfig>,
    pub processes: Option<Vec<ProcessEntry>>,
}

/// Decoded subset of `amdsmi_asic_info_t`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AsicInfo {
    pub vendor_id: u32,
    pub device_id: u64,
    pub rev_id: u32,
    pub asic_serial: String,
    pub oam_id: u32,
    /// 6.3 and later only.
    pub num_compute_units: Option<u32>,
}

/// Decoded `amdsmi_enumeration_info_t` (6.4 and later).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnumerationInfo {
    pub drm_render: u32,
    pub drm_card: u32,
    pub hsa_id: u32,
    pub hip_id: u32,
    pub hip_uuid: String,
}

/// The current accelerator partition profile of a GPU (`amdsmi_accelerator_partition_profile_t`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionProfile {
    /// `"SPX"`, `"DPX"`, `"TPX"`, `"QPX"`, `"CPX"` (accelerator partition enum, stable since 6.3).
    pub profile_type: String,
    pub num_partitions: u32,
    /// Memory modes this profile allows, from the `amdsmi_nps_caps_t` bits: `"NPS1"`, ...
    pub memory_caps: Vec<String>,
    pub profile_index: u32,
    /// The first `num_partitions` entries of the `partition_id` out-array.
    pub partition_ids: Vec<u32>,
    /// XCCs per partition, from the XCC resource profile of this profile, when known.
    pub xcc_per_partition: Option<u32>,
}

/// Every profile a GPU offers (`amdsmi_accelerator_partition_profile_config_t`, 6.4+, root only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProfileConfig {
    pub default_profile_index: u32,
    pub profiles: Vec<PartitionProfile>,
}

/// One entry of `amdsmi_get_gpu_process_list`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessEntry {
    pub pid: u32,
    pub name: String,
    /// `mem`, bytes.
    pub mem_bytes: u64,
    /// `memory_usage.vram_mem`, bytes.
    pub vram_bytes: u64,
}

/// A library call that returned a status other than SUCCESS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CallError {
    /// C symbol name, e.g. `"amdsmi_get_gpu_compute_partition"`.
    pub call: String,
    /// PCI address (or `socket S processor P`) of the device the call was about, if any.
    pub device: Option<String>,
    pub status: u32,
    /// Symbolic name, e.g. `"BUSY"`.
    pub status_name: String,
}

/// The one JSON document the probe child prints on stdout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ProbeOutcome {
    /// `{"outcome":"ok","report":{...}}`
    Ok { report: AmdSmiReport },
    /// `{"outcome":"error","error":{"kind":"...",...}}`
    Error { error: ProbeFailure },
}

/// Why the child could not produce a report; the parent turns it into the matching
/// `AmdSmiError` variant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ProbeFailure {
    /// The child was told not to load anything.
    Disabled,
    /// No candidate library file or soname could be found.
    NotFound { tried: Vec<String> },
    /// `dlopen` failed; `reason` is its message verbatim.
    Load { library: String, reason: String },
    /// A required symbol is absent, or an optional one the enumeration needs.
    MissingSymbol { library: String, symbol: String },
    /// `amdsmi_get_lib_version` returned a first word of no known ABI family.
    UnknownVersion { library: String, word: u32 },
    /// Version query, init or enumeration returned a non-SUCCESS status.
    Status {
        call: String,
        device: Option<String>,
        status: u32,
        name: String,
    },
}
